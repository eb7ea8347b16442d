package main

import (
	"context"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	coordinationv1 "k8s.io/api/coordination/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes/fake"

	"github.com/evercert/evercert/authority"
)

// TestReplicaLiveAsLongAsTheAuthorityWaits: an Authority waits for a peer
// past its Lease's duration by a margin for clocks (a third of the
// duration at the default tolerance). status and rotate --wait judge a
// replica live for as long: before, a replica whose Lease had run its
// duration was reported gone (and rotate --wait said every live replica
// had announced) while its peers still waited for it.
func TestReplicaLiveAsLongAsTheAuthorityWaits(t *testing.T) {
	now := time.Date(2030, 1, 1, 0, 0, 0, 0, time.UTC)
	lease := func(name string, renewed time.Duration) *coordinationv1.Lease {
		holder, seconds := name, int32(180)
		renew := metav1.NewMicroTime(now.Add(-renewed))
		return &coordinationv1.Lease{
			ObjectMeta: metav1.ObjectMeta{Namespace: "ns", Name: name, Labels: map[string]string{authority.LeaseLabel: "ca"}},
			Spec:       coordinationv1.LeaseSpec{HolderIdentity: &holder, LeaseDurationSeconds: &seconds, RenewTime: &renew},
		}
	}
	k := &kube{client: fake.NewClientset(lease("waited-for", 3*time.Minute+50*time.Second), lease("gone", 4*time.Minute+time.Second)), namespace: "ns"}
	got, err := k.replicas(context.Background(), "ca", now, nil, nil, nil)
	require.NoError(t, err)
	require.Len(t, got, 2)
	live := map[string]bool{}
	for _, r := range got {
		live[r.ID] = r.Live
	}
	assert.True(t, live["waited-for"], "renewed 3m50s ago, a 3m Lease: its peers wait for it 4m")
	assert.False(t, live["gone"], "renewed 4m1s ago, a 3m Lease: nobody waits for it")
	assert.Equal(t, 4*time.Minute, authority.LeaseWaitedFor(3*time.Minute))
}

// TestWaitedOnNamesAStoppedProcess: rotate --wait names the replicas the
// Authority waits on. A killed pod leaves its Lease behind, and its peers
// count it live until the Lease runs out: a replica that missed two
// renewals is named with how long it has been silent and when the wait on
// it ends; one that renews on time is named alone.
func TestWaitedOnNamesAStoppedProcess(t *testing.T) {
	now := time.Date(2030, 1, 1, 0, 0, 0, 0, time.UTC)
	at := func(ago time.Duration) *time.Time { v := now.Add(-ago); return &v }
	expires := now.Add(time.Minute)
	fresh := replica{ID: "web-0", RenewTime: at(50 * time.Second), ExpiresAt: &expires, duration: 3 * time.Minute}
	assert.Equal(t, "web-0", fresh.waitedOn(now), "renewed within two intervals of 1m")
	silent := replica{ID: "web-1", RenewTime: at(3 * time.Minute), ExpiresAt: &expires, duration: 3 * time.Minute}
	assert.Equal(t, "web-1 (no renewal for 3m0s, 3 renewal intervals of 1m0s: a stopped process? counted live until 2030-01-01T00:01:00Z)", silent.waitedOn(now))
	assert.Equal(t, "web-2", replica{ID: "web-2"}.waitedOn(now), "a Lease with no renewal time")
}
