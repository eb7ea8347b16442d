package v1alpha1

import (
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
)

func TestDeepCopyIsIndependent(t *testing.T) {
	in := &ServingCertificateList{Items: []ServingCertificate{{
		ObjectMeta: metav1.ObjectMeta{Name: "serving", Labels: map[string]string{"a": "b"}},
		Status: ServingCertificateStatus{
			Provider: "serving", Names: []string{"localhost"}, SNINames: []string{"x"},
			NotBefore: metav1.NewTime(time.Unix(1, 0)), NotAfter: metav1.NewTime(time.Unix(2, 0)),
		},
	}}}
	out := in.DeepCopyObject().(*ServingCertificateList)
	assert.Equal(t, in, out)
	out.Items[0].Status.Names[0] = "changed"
	out.Items[0].Status.SNINames[0] = "changed"
	out.Items[0].Labels["a"] = "changed"
	assert.Equal(t, "localhost", in.Items[0].Status.Names[0])
	assert.Equal(t, "x", in.Items[0].Status.SNINames[0])
	assert.Equal(t, "b", in.Items[0].Labels["a"])
	assert.Nil(t, (*ServingCertificate)(nil).DeepCopy())

	scheme := runtime.NewScheme()
	assert.NoError(t, AddToScheme(scheme))
	gvks, _, err := scheme.ObjectKinds(&ServingCertificate{})
	assert.NoError(t, err)
	assert.Equal(t, SchemeGroupVersion.WithKind(Kind), gvks[0])
}
