# End-to-end test targets; included from the top-level Makefile.
#
#   make kube-bin   build kube-apiserver and etcd into hack/tools/bin
#                   (from source, pinned by hack/tools/go.mod; a no-op when
#                   they are already built at the pinned versions)
#   make test-e2e   run the end-to-end tests (build tag e2e, named TestE2E*)
#                   against those binaries

.PHONY: kube-bin test-e2e

kube-bin:
	$(CURDIR)/hack/install-kube.sh

test-e2e: kube-bin
	EVERCERT_KUBE_BIN=$(CURDIR)/hack/tools/bin go test -race -tags e2e -count=1 -timeout 30m -run '^TestE2E' ./...
