package sni

import (
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"k8s.io/apiserver/pkg/server/dynamiccertificates"

	"github.com/evercert/evercert/dynamiccert"
)

// TestControllerConfigTypedNilProviders: a provider variable that was never
// assigned (a nil *dynamiccert.FileCertKey, say, when the flag that makes
// it was not given) is refused with an error naming the field. Before the
// fix the interface holding it was not nil, so the controller called its
// Name method and panicked.
func TestControllerConfigTypedNilProviders(t *testing.T) {
	serving := newMutable("serving", nil)
	var (
		file *dynamiccert.FileCertKey
		ca   *dynamiccert.FileCA
	)
	for _, tc := range []struct {
		name string
		cfg  ControllerConfig
		want string
	}{
		{"serving", ControllerConfig{Serving: file}, "ControllerConfig.Serving is a nil *dynamiccert.FileCertKey"},
		{"sni", ControllerConfig{Serving: serving, SNI: []dynamiccertificates.SNICertKeyContentProvider{serving, file}}, "ControllerConfig.SNI[1] is a nil *dynamiccert.FileCertKey"},
		{"client CA", ControllerConfig{Serving: serving, ClientCA: ca}, "ControllerConfig.ClientCA is a nil *dynamiccert.FileCA"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			var (
				c   *DynamicServingCertificateController
				err error
			)
			require.NotPanics(t, func() { c, err = NewDynamicServingCertificateController(tc.cfg) })
			require.ErrorContains(t, err, tc.want)
			assert.Nil(t, c)
		})
	}
}
