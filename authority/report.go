package authority

import (
	"errors"

	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/client-go/tools/events"

	"github.com/evercert/evercert/internal/certmetrics"
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

// failedCheck records err, a failed check of an issuer, like failed. A CA
// Secret that cannot be used and that this replica cannot repair
// (unrepairableError) is a condition that lasts until someone repairs it,
// not one failure: it is logged and sent as an Event once (per distinct
// content, as failed does), but every failed check is counted, so that
// evercert_certificate_load_errors_total keeps growing for as long as it
// lasts and an alert on its rate keeps firing.
func (r *reporter) failedCheck(err error) error {
	var broken *unrepairableError
	if !r.Failed(err) && errors.As(err, &broken) {
		certmetrics.LoadError(r.Provider())
	}
	return err
}

// succeeded clears the last error and reports whether there was one.
func (r *reporter) succeeded() (recovered bool) { return r.Succeeded() }

func (r *reporter) lastError() error { return r.LastError() }
