package dynamiccert

import (
	"bytes"
	"context"
	"crypto/x509"
	"fmt"
	"strings"
	"sync"

	"k8s.io/apiserver/pkg/server/dynamiccertificates"

	"github.com/evercert/evercert/internal/certreport"
	"github.com/evercert/evercert/internal/pki"
)

// UnionCA joins several CA providers into one bundle, in order, each CA once
// (the same certificate in two bundles is listed once). It runs the members
// that are ControllerRunners and passes their change notifications on.
//
// A member whose bundle does not parse is left out of the union (counted in
// evercert_certificate_load_errors_total under the member's name and logged,
// once per distinct bad bundle) while the others are still served. All
// methods are safe for concurrent use.
type UnionCA struct {
	members []dynamiccertificates.CAContentProvider
	// reports report the members' bad bundles, which the union is the
	// first to parse when a member is not evercert's.
	reports []*reporter

	mu     sync.Mutex
	inputs [][]byte // member bundles the cached result was built from
	bundle []byte
	opts   x509.VerifyOptions
	ok     bool
}

var (
	_ dynamiccertificates.CAContentProvider = &UnionCA{}
	_ dynamiccertificates.ControllerRunner  = &UnionCA{}
)

// NewUnionCA returns the union of members; nil members are ignored.
func NewUnionCA(members ...dynamiccertificates.CAContentProvider) *UnionCA {
	u := &UnionCA{}
	for _, m := range members {
		if m != nil {
			u.members = append(u.members, m)
			u.reports = append(u.reports, newReporter(m.Name(), nil, nil))
		}
	}
	return u
}

// Name joins the member names with commas.
func (u *UnionCA) Name() string {
	names := make([]string, len(u.members))
	for i, m := range u.members {
		names[i] = m.Name()
	}
	return strings.Join(names, ",")
}

// CurrentCABundleContent returns the deduplicated concatenation of the
// members' current bundles. The result is cached until a member's content
// changes.
func (u *UnionCA) CurrentCABundleContent() []byte {
	u.mu.Lock()
	defer u.mu.Unlock()
	u.refreshLocked()
	return u.bundle
}

// VerifyOptions verifies against every CA in the union; ok is false when the
// union holds no CA.
func (u *UnionCA) VerifyOptions() (x509.VerifyOptions, bool) {
	u.mu.Lock()
	defer u.mu.Unlock()
	u.refreshLocked()
	return u.opts, u.ok
}

func (u *UnionCA) refreshLocked() {
	inputs := make([][]byte, len(u.members))
	same := len(u.inputs) == len(inputs)
	for i, m := range u.members {
		inputs[i] = m.CurrentCABundleContent()
		same = same && bytes.Equal(inputs[i], u.inputs[i])
	}
	if same {
		return
	}
	var out bytes.Buffer
	seen := map[string]bool{}
	pool := x509.NewCertPool()
	for i, in := range inputs {
		if len(in) == 0 {
			continue
		}
		certs, err := pki.ParseCABundle(in)
		if err != nil {
			u.reports[i].Failed(certreport.WithContent(fmt.Errorf("CA bundle of %s left out of the union: %w", u.members[i].Name(), err), in))
			continue
		}
		u.reports[i].Succeeded()
		for _, c := range certs {
			if seen[string(c.Raw)] {
				continue
			}
			seen[string(c.Raw)] = true
			pool.AddCert(c)
			out.Write(pki.EncodeCertPEM(c.Raw))
		}
	}
	u.inputs, u.bundle = inputs, out.Bytes()
	u.opts, u.ok = clientVerifyOptions(pool), len(seen) > 0
}

// AddListener adds listener to every member.
func (u *UnionCA) AddListener(listener dynamiccertificates.Listener) {
	for _, m := range u.members {
		m.AddListener(listener)
	}
}

// RunOnce runs RunOnce on each member that is a ControllerRunner and returns
// the first error.
func (u *UnionCA) RunOnce(ctx context.Context) error {
	var first error
	for _, m := range u.members {
		if r, ok := m.(dynamiccertificates.ControllerRunner); ok {
			if err := r.RunOnce(ctx); err != nil && first == nil {
				first = err
			}
		}
	}
	return first
}

// Run runs each member that is a ControllerRunner until ctx is done.
func (u *UnionCA) Run(ctx context.Context, workers int) {
	var wg sync.WaitGroup
	for _, m := range u.members {
		if r, ok := m.(dynamiccertificates.ControllerRunner); ok {
			wg.Go(func() { r.Run(ctx, workers) })
		}
	}
	wg.Wait()
}
