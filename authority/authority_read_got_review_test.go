package authority

import (
	"context"
	"testing"

	"github.com/stretchr/testify/require"
	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/runtime"
	k8stesting "k8s.io/client-go/testing"
	clocktesting "k8s.io/utils/clock/testing"
)

// TestAGetAheadOfAnEmptyCacheIsDroppedWhenTheWatchRelists: the watch's
// cache holds no Secret; a create refused with AlreadyExists sends the next
// read to the API server, which has a peer's Secret at version 10. The peer
// (or an operator) then deletes it; the watch had expired and relists: the
// list is empty, so the cache still holds no Secret, as when the GET ran.
// The Secret at 10 no longer exists and the watch has delivered since, yet
// reads must not keep returning it without a request.
func TestAGetAheadOfAnEmptyCacheIsDroppedWhenTheWatchRelists(t *testing.T) {
	client, store, src, r := cachedReads(t, rvSecret("10"), "8")
	require.NoError(t, store.Delete(rvSecret("8"))) // the cache holds no Secret

	r.failed(absentRV) // a create refused: AlreadyExists
	got, err := r.read(context.Background(), "ns", "ca")
	require.NoError(t, err)
	require.Equal(t, "10", got.ResourceVersion, "the read after a refused create is a GET")

	require.NoError(t, client.Tracker().Delete(corev1.SchemeGroupVersion.WithResource("secrets"), "ns", "ca"))
	clk := src.Config.Clock.(*clocktesting.FakeClock)
	for range 10 { // ten maxAges of relists and bookmarks, none of them an event for the Secret
		clk.Step(r.maxAge / 2)
		src.MarkDelivered()
		clk.Step(r.maxAge / 2)
		src.MarkDelivered()
	}
	client.ClearActions()
	got, err = r.read(context.Background(), "ns", "ca")
	require.True(t, apierrors.IsNotFound(err), "a Secret deleted on the API server (and absent from the relisted cache) was returned: version %v, %d requests", rvOf(got), len(client.Actions()))
}

// TestAGetRacingTheWatchIsNotHeldPastIt: the watch's cache holds no
// Secret; a create refused with AlreadyExists sends the next read to the
// API server. While that GET is in flight, a healthy watch delivers the
// peer's Secret at version 10 and then its deletion: the cache holds no
// Secret again, as when the read began. The GET's answer (version 10)
// arrives after both events; reads must not keep returning a Secret the
// watch has already shown deleted.
func TestAGetRacingTheWatchIsNotHeldPastIt(t *testing.T) {
	client, store, src, r := cachedReads(t, rvSecret("10"), "8")
	require.NoError(t, store.Delete(rvSecret("8"))) // the cache holds no Secret

	raced := false
	client.PrependReactor("get", "secrets", func(action k8stesting.Action) (bool, runtime.Object, error) {
		if raced {
			return false, nil, nil
		}
		raced = true
		// The GET has been served (version 10); the watch delivers
		// before its answer is handled.
		secret, err := client.Tracker().Get(corev1.SchemeGroupVersion.WithResource("secrets"), "ns", "ca")
		require.NoError(t, err)
		require.NoError(t, store.Add(rvSecret("10")))
		r.observed(rvSecret("10"))
		src.MarkDelivered()
		require.NoError(t, client.Tracker().Delete(corev1.SchemeGroupVersion.WithResource("secrets"), "ns", "ca"))
		require.NoError(t, store.Delete(rvSecret("10")))
		r.observed(nil)
		src.MarkDelivered()
		return true, secret, nil
	})

	r.failed(absentRV) // a create refused: AlreadyExists
	got, err := r.read(context.Background(), "ns", "ca")
	require.NoError(t, err)
	require.Equal(t, "10", got.ResourceVersion, "the read after a refused create is a GET")

	client.ClearActions()
	got, err = r.read(context.Background(), "ns", "ca")
	require.True(t, apierrors.IsNotFound(err), "the watch showed the Secret deleted after the GET read it, yet version %v was returned (%d requests)", rvOf(got), len(client.Actions()))
}
