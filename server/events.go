package server

import (
	"context"
	"sync"

	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/kubernetes/scheme"
	"k8s.io/client-go/tools/events"
	"k8s.io/klog/v2"
)

// EventsReportingController names the server in the Events its Secret
// sources send (events.k8s.io/v1 reportingController).
const EventsReportingController = "evercert.io/server"

// eventSink sends the Events of the providers Build makes from a Secret
// (--tls-secret, --ca-secret) to the API server, about the Secret, in its
// namespace: docs/operating.md's CertificateLoadFailed, ClockSkew,
// EmergencyCARotation, CARequestIgnored and the others. It starts with the
// first RunOnce or Run, so that what the first load reports is sent, and
// stops once Run has returned (or a RunOnce failed, or Serve returned):
// the providers no longer record by then.
type eventSink struct {
	broadcaster events.EventBroadcaster
	recorder    events.EventRecorder

	startOnce, stopOnce sync.Once
	cancel              context.CancelFunc
}

func newEventSink(client kubernetes.Interface) *eventSink {
	b := events.NewBroadcaster(&events.EventSinkImpl{Interface: client.EventsV1()})
	return &eventSink{broadcaster: b, recorder: b.NewRecorder(scheme.Scheme, EventsReportingController)}
}

// start starts sending, once; e may be nil (no Secret source). The
// context is the sink's own: the first caller's may be a start-up context
// that ends before Run's.
func (e *eventSink) start(logger klog.Logger) {
	if e == nil {
		return
	}
	e.startOnce.Do(func() {
		ctx, cancel := context.WithCancel(context.Background())
		e.cancel = cancel
		if err := e.broadcaster.StartRecordingToSinkWithContext(klog.NewContext(ctx, logger)); err != nil {
			// Only a broadcaster already shut down refuses: stop was first.
			logger.Error(err, "Not sending Events: the event broadcaster is stopped")
		}
	})
}

// stop stops sending, once; e may be nil. Events recorded after are
// dropped.
func (e *eventSink) stop() {
	if e == nil {
		return
	}
	e.stopOnce.Do(func() {
		e.startOnce.Do(func() {}) // never start after a stop
		if e.cancel != nil {
			e.cancel()
		}
		e.broadcaster.Shutdown()
	})
}
