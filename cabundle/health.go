package cabundle

import (
	"errors"
	"fmt"
	"net/http"
	"strings"
	"sync"
	"time"

	"k8s.io/apiserver/pkg/server/healthz"
	"k8s.io/klog/v2"
)

// This file holds readiness and health: which targets have been published
// to once (HasSynced), and the health check.

// HasSynced reports whether every target has been published to successfully
// at least once: for a named target, once the object holds the bundle
// (written by the publisher, or found already right); for a selector target,
// once a pass over all objects it selected at that time succeeded, even if
// it selected none. It stays false while any named target is missing, has
// nothing to inject, or cannot be written, and forever if Run stops before
// that. Once true it stays true. It is safe for concurrent use, and has the
// shape of cache.InformerSynced, so cache.WaitForCacheSync can wait for it.
func (p *Publisher) HasSynced() bool {
	select {
	case <-p.ready.done:
		return true
	default:
		return false
	}
}

// readiness records which targets, by index, have been published to once,
// and closes done when all have. It is safe for concurrent use.
type readiness struct {
	done chan struct{}

	mu        sync.Mutex
	published []bool
	left      int // targets not published yet
}

func newReadiness(targets int) *readiness {
	return &readiness{done: make(chan struct{}), published: make([]bool, targets), left: targets}
}

// mark records that t has been published to once, logging the first time,
// and closes done when it was the last one.
func (r *readiness) mark(logger klog.Logger, t *targetState) {
	r.mu.Lock()
	defer r.mu.Unlock()
	if r.published[t.index] {
		return
	}
	r.published[t.index] = true
	r.left--
	logger.V(1).Info("Target published", "target", t.Target.String())
	if r.left == 0 {
		close(r.done)
		logger.Info("caBundle published to every target", "targets", len(r.published))
	}
}

// waiting returns the indexes of the targets not published to yet.
func (r *readiness) waiting() []int {
	r.mu.Lock()
	defer r.mu.Unlock()
	var out []int
	for i, ok := range r.published {
		if !ok {
			out = append(out, i)
		}
	}
	return out
}

// HealthCheck returns a health check, named like the publisher
// (PublisherConfig.Name, default "cabundle"), for a readiness or health
// endpoint. It fails while any target has never been published to (its
// object is missing, has nothing to publish to, or every write failed so
// far), any object's caBundle is contested, or any object's published
// bundle does not verify what is served (PublisherConfig.Verify). Its error
// names each such target or object as "Kind/name" with the reason (for a
// contested object, the other writer and when the next write is due). It
// reads only the publisher's state, makes no API call, and is safe for
// concurrent use.
func (p *Publisher) HealthCheck() healthz.HealthChecker { return healthCheck{p} }

type healthCheck struct{ p *Publisher }

func (h healthCheck) Name() string { return h.p.name }

func (h healthCheck) Check(*http.Request) error {
	p := h.p
	var problems []string
	for _, i := range p.ready.waiting() {
		t := p.targets[i]
		what := t.Target.String()
		if t.Name != "" {
			what = objectKey(t.Kind, t.Name)
		}
		msg := what + ": not published yet"
		if t.Name != "" {
			if state := p.logs.State(objectKey(t.Kind, t.Name)); state != "" {
				msg += " (" + state + ")"
			}
		}
		problems = append(problems, msg)
	}
	for _, c := range p.contests.contested() {
		next := "now"
		if c.wait > 0 {
			next = "in " + c.wait.Round(time.Second).String()
		}
		problems = append(problems, fmt.Sprintf("%s: caBundle contested by %s since %s: %s; backing off, next write %s",
			c.key, orUnknown(c.manager), c.since.UTC().Format(time.RFC3339), c.cause, next))
	}
	problems = append(problems, p.unverified()...)
	if len(problems) == 0 {
		return nil
	}
	return errors.New(strings.Join(problems, "; "))
}
