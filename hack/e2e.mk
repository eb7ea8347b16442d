# End-to-end test targets; included from the top-level Makefile.
#
#   make kube-bin   build kube-apiserver and etcd into hack/tools/bin
#                   (from source, pinned by hack/tools/go.mod; a no-op when
#                   they are already built at the pinned versions)
#   make test-e2e   run the end-to-end tests (build tag e2e, named TestE2E*)
#                   against those binaries, except the API budget tier
#   make test-budget-e2e
#                   the API budget of issue 22 (TestE2EBudget*): ten
#                   example/server replicas on a kube-apiserver with API
#                   Priority and Fairness, requests at rest and per CA
#                   rotation from its apiserver_request_total, promotion
#                   time, and a rotation under a one-seat priority level;
#                   logs into tmp/budget-e2e.log and prints the tables.
#                   Without -race: it counts requests and times promotions,
#                   which the race detector only slows (test-e2e and
#                   test-unit run the same code under it)

.PHONY: kube-bin test-e2e test-budget-e2e

kube-bin:
	$(CURDIR)/hack/install-kube.sh

# E2E_PKGS are the packages of this module with TestE2E* tests: only they
# are built. ./... built and linked every package's test binary with -race
# and the e2e tag, some 30 of them with nothing to run, minutes of a CI run.
E2E_PKGS = $(shell go list -tags e2e -f '{{range .TestGoFiles}}{{$$.Dir}}/{{.}} {{end}}{{range .XTestGoFiles}}{{$$.Dir}}/{{.}} {{end}}' ./... | xargs grep -l '^func TestE2E' | xargs -n1 dirname | sort -u | sed 's|^$(CURDIR)|.|')

test-e2e: kube-bin
	@pkgs="$(E2E_PKGS)"; test -n "$$pkgs" || { echo "test-e2e: no package with TestE2E tests found"; exit 1; }; echo "test-e2e: $$pkgs"
	$(CURDIR)/hack/gotest.sh $(CURDIR)/tmp/e2e.log env EVERCERT_KUBE_BIN=$(CURDIR)/hack/tools/bin go test -race -tags e2e -count=1 -parallel 2 -timeout 30m -run '^TestE2E' -skip '^TestE2EBudget' $(E2E_PKGS)

BUDGET_TESTS := TestE2EBudgetAtRestAndRotation TestE2EBudgetAPF
test-budget-e2e: kube-bin
	@mkdir -p $(CURDIR)/tmp
	$(CURDIR)/hack/gotest.sh $(CURDIR)/tmp/budget-e2e.log env EVERCERT_KUBE_BIN=$(CURDIR)/hack/tools/bin go test -tags e2e -count=1 -v -timeout 10m -run '^TestE2EBudget' ./test/e2e/
	@for t in $(BUDGET_TESTS); do grep -qE "^--- PASS: $$t " $(CURDIR)/tmp/budget-e2e.log || { echo "test-budget-e2e: $$t did not run"; cat $(CURDIR)/tmp/budget-e2e.log; exit 1; }; done
	@grep -E '(baseline, the cluster alone|at rest, [0-9]+ replicas over|one CA rotation, |APF: priority level|: promotion past the)|^        (VERB|non-watch total|[A-Z]+ +[a-z/.]+[^ ]* +[0-9]{3} )' $(CURDIR)/tmp/budget-e2e.log
