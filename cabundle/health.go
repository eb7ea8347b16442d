package cabundle

import (
	"errors"
	"fmt"
	"net/http"
	"strings"
	"time"

	"k8s.io/apiserver/pkg/server/healthz"
)

// HealthCheck returns a health check, named like the publisher (Config.Name,
// default "cabundle"), for a readiness or health endpoint. It fails while
// any target has never been published to (its object is missing, has
// nothing to publish to, or every write failed so far) or any object's
// caBundle is contested, and its error names each such target or object as
// "Kind/name" with the reason: the other writer and when the next write is
// due, for a contested object. It reads only the publisher's state, makes
// no API call, and is safe for concurrent use.
func (p *Publisher) HealthCheck() healthz.HealthChecker { return healthCheck{p} }

type healthCheck struct{ p *Publisher }

func (h healthCheck) Name() string { return h.p.name }

func (h healthCheck) Check(*http.Request) error {
	p := h.p
	var problems []string
	p.mu.Lock()
	var waiting []*targetState
	for _, t := range p.targets {
		if !t.ready {
			waiting = append(waiting, t)
		}
	}
	p.mu.Unlock()
	for _, t := range waiting {
		what := t.Target.String()
		if t.Name != "" {
			what = objectKey(t.Kind, t.Name)
		}
		msg := what + ": not published yet"
		if t.Name != "" {
			if state := p.loggedState(objectKey(t.Kind, t.Name)); state != "" && state != "ok" {
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
	if len(problems) == 0 {
		return nil
	}
	return errors.New(strings.Join(problems, "; "))
}
