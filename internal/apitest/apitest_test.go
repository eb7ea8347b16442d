package apitest

import (
	"context"
	"testing"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes/fake"
)

func TestRecentNamesWhatKeptMoving(t *testing.T) {
	client := fake.NewClientset(&corev1.Secret{ObjectMeta: metav1.ObjectMeta{Namespace: "ns", Name: "ca"}})
	ctx := context.Background()
	if _, err := client.CoreV1().Secrets("ns").List(ctx, metav1.ListOptions{}); err != nil {
		t.Fatal(err)
	}
	for range 3 {
		if _, err := client.CoreV1().Secrets("ns").Get(ctx, "ca", metav1.GetOptions{}); err != nil {
			t.Fatal(err)
		}
	}
	if got, want := Recent(client.Actions(), 3), "last 3 actions: get secrets ca: 3"; got != want {
		t.Errorf("Recent(3) = %q, want %q", got, want)
	}
	if got, want := Recent(client.Actions(), 0), "last 4 actions: get secrets ca: 3, list secrets: 1"; got != want {
		t.Errorf("Recent(all) = %q, want %q", got, want)
	}
	if got := Recent(nil, RecentWindow); got != "no actions" {
		t.Errorf("Recent(nil) = %q", got)
	}
}

func TestGetRecordsNoAction(t *testing.T) {
	client := fake.NewClientset(&corev1.Secret{ObjectMeta: metav1.ObjectMeta{Namespace: "ns", Name: "ca"}})
	s, err := Get[*corev1.Secret](client.Tracker(), corev1.SchemeGroupVersion.WithResource("secrets"), "ns", "ca")
	if err != nil || s.Name != "ca" {
		t.Fatalf("Get = %v, %v", s, err)
	}
	if n := len(client.Actions()); n != 0 {
		t.Errorf("Get recorded %d actions, want 0", n)
	}
	if _, err := Get[*corev1.ConfigMap](client.Tracker(), corev1.SchemeGroupVersion.WithResource("secrets"), "ns", "ca"); err == nil {
		t.Error("Get with the wrong type: no error")
	}
}
