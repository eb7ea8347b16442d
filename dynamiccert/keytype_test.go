package dynamiccert

import (
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/evercert/evercert/internal/pki"
)

func TestKeyTypesMatchInternal(t *testing.T) {
	require.Len(t, KeyTypes, len(pki.KeyTypes))
	for i, kt := range KeyTypes {
		assert.Equal(t, string(pki.KeyTypes[i]), string(kt), "dynamiccert.KeyType must name pki's types")
	}
}
