package certreport_test

import (
	"encoding/json"
	"strings"
	"testing"
	"unicode/utf8"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	corev1 "k8s.io/api/core/v1"
	"k8s.io/client-go/tools/events"

	"github.com/evercert/evercert/internal/certreport"
	"github.com/evercert/evercert/internal/certreport/certreporttest"
)

// TestEventNoteIsCutAtARune: a long note with multi-byte characters (a
// non-ASCII file path or subject in an error) is cut between characters.
// Before the fix it was cut inside one: the invalid bytes left became
// U+FFFD, three bytes each, when the Event was encoded as JSON for the API
// server, which then refused the note as longer than 1024 bytes and the
// Event was lost.
func TestEventNoteIsCutAtARune(t *testing.T) {
	rec := events.NewFakeRecorder(1)
	r := certreport.New("p", rec, certreporttest.Pod)
	r.Event(corev1.EventTypeWarning, certreport.ReasonCertificateLoadFailed, certreport.ActionLoad,
		"xx"+strings.Repeat("€", 2000)) // 3 bytes each: the cut at byte 1021 is inside one
	e := <-rec.Events
	note := strings.TrimPrefix(e, "Warning CertificateLoadFailed ")
	assert.True(t, utf8.ValidString(note), "cut between characters")
	assert.True(t, strings.HasSuffix(note, "..."))
	encoded, err := json.Marshal(note)
	require.NoError(t, err)
	var sent string
	require.NoError(t, json.Unmarshal(encoded, &sent))
	assert.LessOrEqual(t, len(sent), 1024, "the note the API server receives fits its limit")
}
