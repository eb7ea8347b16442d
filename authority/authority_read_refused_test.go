package authority

import (
	"context"
	"testing"

	"github.com/stretchr/testify/require"
	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes/fake"
	"k8s.io/client-go/tools/cache"
	clocktesting "k8s.io/utils/clock/testing"

	"github.com/evercert/evercert/internal/secretwatch"
)

// TestRefusedWriteIgnoresAnOlderDelivery: the cache holds version 8, a GET
// read version 10, and a write based on 10 is refused (Conflict). A watch
// that lags then delivers version 9. The next read must still be a GET:
// deciding on 9 would undo what this replica saw at 10 (a compromised-ca
// mark, a successor). A review found that any delivery other than the
// refused version ended the GETs.
func TestRefusedWriteIgnoresAnOlderDelivery(t *testing.T) {
	_, store, src, r := cachedReads(t, rvSecret("10"), "8")

	r.failed("10") // the write based on version 10 was refused
	require.NoError(t, store.Update(rvSecret("9")))
	src.MarkDelivered() // the lagging watch delivers 9

	got, err := r.read(context.Background(), "ns", "ca")
	require.NoError(t, err)
	require.Equal(t, "10", got.ResourceVersion, "the read came from a cache older than the refused version")
}

// TestAGetAheadOfTheCacheIsNotUndoneByIt: a refused write sends the next
// read to the API server, which has version 10 while the watch's cache
// still holds 8. The read after that must not decide on 8 again: a replica
// that had seen a peer's successor at 10 took 8 for a rollback and wrote
// its CAs back (TestAdoptCertControllerSecret failed so, 1 run in 200).
// Once the watch shows 10, the cache is used again.
func TestAGetAheadOfTheCacheIsNotUndoneByIt(t *testing.T) {
	client, store, src, r := cachedReads(t, rvSecret("10"), "8")

	r.failed("8") // a write based on the cache's version 8 was refused
	got, err := r.read(context.Background(), "ns", "ca")
	require.NoError(t, err)
	require.Equal(t, "10", got.ResourceVersion, "the read after a refused write is a GET")

	client.ClearActions()
	got, err = r.read(context.Background(), "ns", "ca")
	require.NoError(t, err)
	require.Equal(t, "10", got.ResourceVersion, "the read after the GET came from a cache older than what the GET saw")
	require.Empty(t, client.Actions(), "the version the GET read is returned again without a request while the cache has not moved")

	client.ClearActions()
	require.NoError(t, store.Update(rvSecret("10")))
	r.observed(rvSecret("10"))
	src.MarkDelivered() // the watch catches up
	got, err = r.read(context.Background(), "ns", "ca")
	require.NoError(t, err)
	require.Equal(t, "10", got.ResourceVersion)
	require.Empty(t, client.Actions(), "once the watch shows what the GET saw, reads use the cache again")
}

// TestADeletedSecretEndsTheWaitForAVersion: a GET read version 10 while
// the cache held 8, so reads wait for the cache to show 10. The Secret is
// then deleted, and the watch shows the deletion: 10 will never show, and
// a GET that finds no Secret agrees with the cache. Reads use the cache
// again rather than GET at every check until the Secret is recreated.
func TestADeletedSecretEndsTheWaitForAVersion(t *testing.T) {
	client, store, src, r := getAheadOfCache(t)

	require.NoError(t, client.CoreV1().Secrets("ns").Delete(context.Background(), "ca", metav1.DeleteOptions{}))
	require.NoError(t, store.Delete(rvSecret("8")))
	r.observed(nil)
	src.MarkDelivered()
	_, err := r.read(context.Background(), "ns", "ca")
	require.True(t, apierrors.IsNotFound(err), "%v", err)

	client.ClearActions()
	_, err = r.read(context.Background(), "ns", "ca")
	require.True(t, apierrors.IsNotFound(err), "%v", err)
	require.Empty(t, client.Actions(), "a GET found no Secret, as the cache holds: reads use the cache again")
}

// TestAGetThatFindsNoSecretIsNotUndoneByTheCache: the watch's cache still
// holds version 8 when a GET (after a failed write) finds that the Secret
// was deleted. The API server is ahead of the cache, as when a GET reads a
// newer version (TestAGetAheadOfTheCacheIsNotUndoneByIt): the read after
// it must not decide on version 8, a Secret that no longer exists, until
// the watch shows the deletion.
func TestAGetThatFindsNoSecretIsNotUndoneByTheCache(t *testing.T) {
	client, store, src, r := cachedReads(t, nil, "8") // deleted on the API server

	r.failed("8") // a write based on the cache's version 8 was refused
	_, err := r.read(context.Background(), "ns", "ca")
	require.True(t, apierrors.IsNotFound(err), "the read after a refused write is a GET: %v", err)

	got, err := r.read(context.Background(), "ns", "ca")
	require.True(t, apierrors.IsNotFound(err), "the read after the GET came from a cache older than what the GET saw: version %v", rvOf(got))

	client.ClearActions()
	require.NoError(t, store.Delete(rvSecret("8")))
	r.observed(nil)
	src.MarkDelivered() // the watch catches up
	_, err = r.read(context.Background(), "ns", "ca")
	require.True(t, apierrors.IsNotFound(err), "%v", err)
	require.Empty(t, client.Actions(), "once the watch shows the deletion, reads use the cache again")
}

func rvOf(s *corev1.Secret) string {
	if s == nil {
		return "(none)"
	}
	return s.ResourceVersion
}

// rvSecret is the CA Secret at resourceVersion rv, nothing else set.
func rvSecret(rv string) *corev1.Secret {
	return &corev1.Secret{ObjectMeta: metav1.ObjectMeta{Namespace: "ns", Name: "ca", ResourceVersion: rv}}
}

// getAheadOfCache returns cachedReads with version 10 on the API server and
// 8 in the cache, after a refused write based on 8 and the GET that read
// 10: reads now wait for the cache to show 10.
func getAheadOfCache(t *testing.T) (*fake.Clientset, cache.Store, *secretwatch.Source, *secretReads) {
	t.Helper()
	client, store, src, r := cachedReads(t, rvSecret("10"), "8")
	r.failed("8")
	got, err := r.read(context.Background(), "ns", "ca")
	require.NoError(t, err)
	require.Equal(t, "10", got.ResourceVersion, "the read after a refused write is a GET")
	return client, store, src, r
}

// cachedReads returns secretReads over a synced watch cache holding the
// Secret at cacheRV, the API server holding onAPI (nil: none).
func cachedReads(t *testing.T, onAPI *corev1.Secret, cacheRV string) (*fake.Clientset, cache.Store, *secretwatch.Source, *secretReads) {
	t.Helper()
	client := fake.NewClientset()
	if onAPI != nil {
		client = fake.NewClientset(onAPI)
	}
	src, err := secretwatch.New(secretwatch.Config{Namespace: "ns", SecretName: "ca", Client: client, Clock: clocktesting.NewFakeClock(testNow)})
	require.NoError(t, err)
	store := cache.NewStore(cache.MetaNamespaceKeyFunc)
	require.NoError(t, store.Add(rvSecret(cacheRV)))
	src.Cache.Store(&secretwatch.View{Store: store, Synced: func() bool { return true }})
	src.MarkDelivered()
	return client, store, src, newSecretReads(src, secretReadsMaxAge(0))
}

// TestACacheThatMovesOnIsNotOrderedAgainstAGet: a GET read version 10
// while the cache held 8; a relist then takes the cache to 11 without
// showing 10. Versions are not ordered, so the read after it neither
// returns 10 (older than the cache) nor 11 unconfirmed: it GETs.
func TestACacheThatMovesOnIsNotOrderedAgainstAGet(t *testing.T) {
	client, store, src, r := getAheadOfCache(t)

	require.NoError(t, client.Tracker().Update(corev1.SchemeGroupVersion.WithResource("secrets"), rvSecret("11"), "ns"))
	require.NoError(t, store.Update(rvSecret("11")))
	src.MarkDelivered() // a relist: 11, never 10
	client.ClearActions()
	got, err := r.read(context.Background(), "ns", "ca")
	require.NoError(t, err)
	require.Equal(t, "11", got.ResourceVersion)
	require.Len(t, client.Actions(), 1, "the cache moved past the version the GET read: the read is a GET")

	client.ClearActions()
	got, err = r.read(context.Background(), "ns", "ca")
	require.NoError(t, err)
	require.Equal(t, "11", got.ResourceVersion)
	require.Empty(t, client.Actions(), "the GET found the cache current: reads use it again")
}
