package dynamiccert

import (
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/client-go/tools/events"

	"github.com/evercert/evercert/internal/certreport"
)

// reporter is how a provider reports its content: each change once (a log
// line, the metrics, an Event on rotation) and each distinct load failure
// once (counted, logged, an Event), however often it is retried; see
// internal/certreport.
type reporter struct {
	*certreport.Reporter
}

// newReporter returns a reporter for provider name. Events go to recorder,
// about object, when both are set.
func newReporter(name string, recorder events.EventRecorder, object runtime.Object) *reporter {
	return &reporter{certreport.New(name, recorder, object)}
}

// failed records err (which must name the source) and returns it.
func (r *reporter) failed(err error) error {
	r.Failed(err)
	return err
}

// succeeded clears the last error and reports whether there was one.
func (r *reporter) succeeded() (recovered bool) { return r.Succeeded() }

func (r *reporter) lastError() error { return r.LastError() }
