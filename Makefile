# evercert: see README.md. `make run` starts the example server on its
# embedded self-signed default; `make test` runs every test tier CI runs.

GO        ?= go
BIN       := $(CURDIR)/bin
RUN_ARGS  ?= --secure-port=8443 --ca-bundle-file=$(CURDIR)/tmp/evercert-ca.crt
BENCH     ?= .
BENCHTIME ?= 1s
COUNT     ?= 6

.PHONY: simulate-adopt all build deps test test-unit test-sim test-budget simulate test-alloc test-alloc-server test-fips test-alerts test-controller-runtime test-grpc test-controllerruntime-lib test-deploy generate-kustomize image test-migrate test-operator-e2e test-cli test-hsm soak soak-short soak-run bench docs-figures verify run fuzz clean

all: build

build:
	$(GO) build ./...

## test: everything CI runs (unit with -race, the allocation checks, end-to-end
## against a real kube-apiserver, short soak, FIPS 140-3 mode, the alert
## rules, the recipes (controller-runtime, gRPC), the CLI, the API budget on
## a real kube-apiserver, the nested modules (controllerruntime, migrations,
## deploy manifests and images, PKCS#11).
test: test-unit test-sim test-budget test-alloc test-alloc-server test-fips test-alerts test-controller-runtime test-grpc test-controllerruntime-lib test-deploy test-migrate test-operator-e2e test-cli test-hsm test-budget-e2e test-e2e soak-short

## deps: Debian packages the tests need (sslscan, openssl, prometheus for promtool, softhsm2).
deps:
	hack/install-deps.sh

## test-unit: unit and integration tests with the race detector; real TLS
## handshakes on 127.0.0.1. The wall-clock scenarios the simulator covers
## (SIM_COVERED: rollouts at any cadence and forged Leases, each with a
## mutation test-sim must catch) run in make soak instead; the Authority's
## API budget tests (BUDGET_UNIT_TESTS) run in test-budget, without -race.
## -timeout 40m: the authority package alone took 953 s of the 20 minutes
## it had, on a loaded 2-core machine.
SIM_COVERED := TestRollingRestartsNeverStallRotation|TestAnnouncementForgerCannotStallPromotion
test-unit: deps
	$(CURDIR)/hack/gotest.sh $(CURDIR)/tmp/unit.log $(GO) test -race -count=1 -timeout 40m -skip '^($(SIM_COVERED)|$(subst $(eval) ,|,$(BUDGET_UNIT_TESTS)))$$' ./...

## test-budget: the Authority's API budget (authority/budget_test.go): the
## requests N replicas send at rest and per CA rotation, on a fake clientset
## and a fake clock through the Run loops. Without -race: they count
## requests, which the race detector only slowed (225 s of the authority
## package's 755 s under -race, 43 s without); test-unit runs the same code
## under it in every other Authority test. Fails if a test did not pass.
BUDGET_UNIT_TESTS := TestAPIBudgetAtRest TestAPIBudgetPerRotation
test-budget:
	@mkdir -p $(CURDIR)/tmp
	$(CURDIR)/hack/gotest.sh $(CURDIR)/tmp/budget.log $(GO) test -count=1 -v -timeout 10m -run '^($(subst $(eval) ,|,$(BUDGET_UNIT_TESTS)))$$' ./authority/
	@for t in $(BUDGET_UNIT_TESTS); do grep -qE "^--- PASS: $$t " $(CURDIR)/tmp/budget.log || { echo "test-budget: $$t did not pass"; tail -60 $(CURDIR)/tmp/budget.log; exit 1; }; done
	@grep -E '^--- |requests beyond the renewals|per replica per minute' $(CURDIR)/tmp/budget.log

## test-sim: the seeded simulator (authority/simulate_test.go), without
## -race: R real Authority replicas (1-10) on simulated clocks and a
## simulated API server, faults drawn from each seed, invariants S1-S3, V1,
## L1, R1 and R2 checked after every event (docs/architecture.md, "Simulator").
## SIM_SEEDS seeds of every fault kind but hand edits and a publisher that
## stops alone; then each mutation of the rules (the old ones field trial 4
## found) must be caught from seed 1 on, and the open gaps still reached.
## A failure prints the seed and the shrunk schedule. Fails if a test did
## not pass.
SIM_SEEDS ?= 10000
SIM_TESTS := TestSimulate TestSimulateFindsMutations TestSimulateFindsOpenGaps
test-sim:
	@mkdir -p $(CURDIR)/tmp
	$(CURDIR)/hack/gotest.sh $(CURDIR)/tmp/sim.log $(GO) test -count=1 -v -timeout 30m -run '^($(subst $(eval) ,|,$(SIM_TESTS)))$$' ./authority/ -args -sim.seeds=$(SIM_SEEDS) -sim.mutations
	@for t in $(SIM_TESTS); do grep -qE "^--- PASS: $$t " $(CURDIR)/tmp/sim.log || { echo "test-sim: $$t did not pass"; tail -60 $(CURDIR)/tmp/sim.log; exit 1; }; done
	@grep -E '^(--- |ok )|seeds in|found after|of [0-9]+ seeds|shrunk:|^ {10}[0-9]' $(CURDIR)/tmp/sim.log

## simulate: long simulator runs (not part of make test): SEEDS seeds from
## SIM_FIRST with every fault kind, hand edits included, and every mutation,
## the slow ones included. It stops at the first violation, printing its seed
## and shrunk schedule; replay one with
## go test -run '^TestSimulate$$' ./authority/ -args -sim.seed=N -sim.hand-edits,
## or a shrunk schedule with -sim.plan='<schedule, lines joined with \n>'.
SEEDS ?= 100000
SIM_FIRST ?= 1
simulate:
	$(GO) test -count=1 -v -timeout 0 -run '^(TestSimulate|TestSimulateFindsMutations)$$' ./authority/ -args -sim.seeds=$(SEEDS) -sim.first=$(SIM_FIRST) -sim.hand-edits -sim.mutations -sim.long-mutations 2>&1 | grep -vE '^[EIW][0-9]{4} '

## simulate-adopt: the adoption plans (1 seed in 5: the old rotator's pods
## still rewriting cert-controller's Secret while the replicas run;
## invariants A1-A3), not part of make test while some of their seeds still
## break an invariant: every violating seed of SEEDS from SIM_FIRST, listed
## by invariant (-sim.census). Their regressions and mutations run in make
## test-sim.
simulate-adopt:
	$(GO) test -count=1 -v -timeout 0 -run '^TestSimulate$$' ./authority/ -args -sim.seeds=$(SEEDS) -sim.first=$(SIM_FIRST) -sim.adopt -sim.census 2>&1 | grep -E '^(--- |ok |FAIL)|seeds in|census:'

## test-alloc: the zero-allocation promise of the handshake path, checked
## without -race (the race detector allocates, so these tests are built only
## without it), and the cost of choosing between an ECDSA and an RSA
## certificate. Fails if any of the tests did not run.
ALLOC_TESTS := TestLookupDoesNotAllocate TestDualLookupAllocations
test-alloc:
	@mkdir -p $(CURDIR)/tmp
	$(CURDIR)/hack/gotest.sh $(CURDIR)/tmp/alloc.log $(GO) test -count=1 -v -run '^($(subst $(eval) ,|,$(ALLOC_TESTS)))$$' ./sni/
	@for t in $(ALLOC_TESTS); do grep -qE "^--- PASS: $$t " $(CURDIR)/tmp/alloc.log || { echo "test-alloc: $$t did not run"; cat $(CURDIR)/tmp/alloc.log; exit 1; }; done
	@grep -E '^(--- |    alloc_test)' $(CURDIR)/tmp/alloc.log

## test-fips: FIPS 140-3 mode (test/fips, build tag fips): builds
## ./example/server with GOFIPS140=latest, runs it under GODEBUG=fips140=only
## and checks it with sslscan, a Go client (mTLS included) and a signature
## algorithm prober; start-up refusals; Options.Validate in child processes
## under fips140=only, on and off. Fails if any of the tests did not run.
FIPS_TESTS := TestFIPSBuild TestFIPSSelfSignedDefault TestFIPSDualKeyTypes TestFIPSFilesSNIAndClientCA TestFIPSStartupRefusals TestFIPSRefusalsNeedFIPSMode TestFIPSHelp TestFIPSValidate
test-fips: deps
	@mkdir -p $(CURDIR)/tmp
	$(CURDIR)/hack/gotest.sh $(CURDIR)/tmp/fips.log $(GO) test -tags fips -count=1 -v -timeout 10m ./test/fips/
	@for t in $(FIPS_TESTS); do grep -qE "^--- PASS: $$t " $(CURDIR)/tmp/fips.log || { echo "test-fips: $$t did not run"; cat $(CURDIR)/tmp/fips.log; exit 1; }; done
	@grep -E '^(--- |ok )' $(CURDIR)/tmp/fips.log

## test-alerts: the Prometheus rules in deploy/prometheus, checked with
## promtool (check rules) and unit-tested with it (rules_test.yaml: input
## series -> expected alerts). Fails, never skips, without promtool. The Go
## tests in deploy/prometheus (test-unit) keep the PrometheusRule in sync
## with the rule file and the metric names real.
test-alerts: deps
	@command -v promtool >/dev/null || { echo 'test-alerts: promtool not found; it comes with the Debian package prometheus (make deps)'; exit 1; }
	promtool check rules deploy/prometheus/rules.yaml
	promtool test rules deploy/prometheus/rules_test.yaml

## test-controller-runtime: the README's controller-runtime recipe against a
## real controller-runtime webhook.Server: mTLS, TLS 1.3 floor, HTTP/2 off,
## AdmissionReviews through leaf and CA rotations. test/controllerruntime is
## its own module, so the library takes no controller-runtime dependency.
## Fails if the test did not run.
## -race stays: the providers rotate inside the test process, beside the
## webhook.Server that reads them.
test-controller-runtime:
	@mkdir -p $(CURDIR)/tmp
	cd test/controllerruntime && $(CURDIR)/hack/gotest.sh $(CURDIR)/tmp/controller-runtime.log $(GO) test -race -count=1 -v ./...
	@grep -E '^--- PASS: TestControllerRuntimeRecipe ' $(CURDIR)/tmp/controller-runtime.log || { echo 'test-controller-runtime: TestControllerRuntimeRecipe did not run'; cat $(CURDIR)/tmp/controller-runtime.log; exit 1; }

## test-grpc: the README's gRPC recipe with a real grpc-go server and client:
## leaf, CA and client-CA rotations under live calls, mTLS required
## throughout. test/grpc is its own module, so the library takes no gRPC
## dependency. Fails if the test did not run.
## -race stays: the providers rotate inside the test process, beside the
## grpc-go server and client that read them.
test-grpc:
	@mkdir -p $(CURDIR)/tmp
	cd test/grpc && $(CURDIR)/hack/gotest.sh $(CURDIR)/tmp/grpc.log $(GO) test -race -count=1 -v ./...
	@grep -E '^--- PASS: TestGRPCRecipe ' $(CURDIR)/tmp/grpc.log || { echo 'test-grpc: TestGRPCRecipe did not run'; cat $(CURDIR)/tmp/grpc.log; exit 1; }

## test-hsm: the pkcs11 module (CA keys in a PKCS#11 token) with SoftHSM2
## tokens made in a temporary directory: an Authority serving over TLS with
## its CA key in the token, a second replica, a rotation, the token missing,
## a wrong PIN, a key removed, an HSM that hangs, moving a PEM key into the
## token, a token that goes away and comes back, two processes on one token,
## and one Authority against a real kube-apiserver. Its own module
## (cgo), so the library stays pure Go. Fails if any named test did not pass.
## -race stays: the Authorities and the key source run in the test process
## (pkcs11 is its own module: make test-unit does not cover it).
HSM_TESTS := TestAuthorityCAKeyInSoftHSM TestAuthorityCAKeySourceUnavailable TestAuthorityCAKeyRemovedFromToken TestAuthorityHSMStopsAnswering TestAuthorityWithoutCAKeysRefusesKeyRef TestAuthorityMovesPEMKeyIntoSoftHSM TestKeySourceMakesAndFindsKeys TestAuthorityCAKeyInSoftHSMOnRealAPIServer TestREADMEHSMRecipeIsCompiled TestAuthoritySignLeafConcurrentlyWithKeyInSoftHSM TestAuthorityRecoversWhenTokenComesBack TestKeySourceReopenKeepsSignersWorking TestKeySourceFindsKeyMadeByAnotherProcess
test-hsm: deps kube-bin
	@mkdir -p $(CURDIR)/tmp
	cd pkcs11 && $(CURDIR)/hack/gotest.sh $(CURDIR)/tmp/hsm.log env CGO_ENABLED=1 EVERCERT_KUBE_BIN=$(CURDIR)/hack/tools/bin $(GO) test -race -count=1 -v ./...
	@for t in $(HSM_TESTS); do grep -qE "^--- PASS: $$t " $(CURDIR)/tmp/hsm.log || { echo "test-hsm: $$t did not pass"; cat $(CURDIR)/tmp/hsm.log; exit 1; }; done

## test-controllerruntime-lib: the controllerruntime module (Add, the one
## call in a controller-runtime manager) against a real kube-apiserver and
## etcd from hack/tools/bin: a non-leader manager serving a validating webhook
## through leaf and CA rotations, the ready gate, bad input, the README
## recipes. Its own module, so the library takes no controller-runtime
## dependency. Fails if any named test did not pass.
## -race stays: Add and the manager it wires run in the test process
## (its own module: make test-unit does not cover it).
CONTROLLERRUNTIME_LIB_TESTS := TestAddWebhookThroughRotationsOnNonLeader TestAddRefusesBadConfig TestAddSourceWithoutTargets TestAddAfterStartIsRefused TestREADMERecipesAreCompiled TestChecksFollowTheServedCertificate TestFailedAddLeavesTheSourceAlone TestSecondAddIsRefused TestAddServesMetricsOnTheManagersEndpoint
test-controllerruntime-lib: kube-bin
	@mkdir -p $(CURDIR)/tmp
	cd controllerruntime && $(CURDIR)/hack/gotest.sh $(CURDIR)/tmp/controllerruntime-lib.log env EVERCERT_KUBE_BIN=$(CURDIR)/hack/tools/bin $(GO) test -race -count=1 -v .
	@for t in $(CONTROLLERRUNTIME_LIB_TESTS); do grep -qE "^--- PASS: $$t " $(CURDIR)/tmp/controllerruntime-lib.log || { echo "test-controllerruntime-lib: $$t did not pass"; cat $(CURDIR)/tmp/controllerruntime-lib.log; exit 1; }; done

## test-deploy: the Helm charts of deploy/helm, the kustomize bases of
## deploy/kustomize and the container images (test/deploy, its own module):
## each chart linted, rendered with its defaults into the objects of its
## base and with other values into their flags and fields, pushed to and
## pulled from an in-process OCI registry and installed from there on a real
## kube-apiserver (server-side dry run, then helm install); each base rendered with the
## kustomize API and server-side applied (dryRun=All) to a real
## kube-apiserver; every request of each example allowed to its
## ServiceAccount and near misses denied (SubjectAccessReviews); every flag
## of the Deployments taken by the binary; each image built (make image's
## builder), unpacked and run, serving TLS and /readyz 200, the webhook,
## signer and apiserver as their ServiceAccount; the webhook's image built a
## second time to the same digest, its SBOM, provenance and signatures
## attached and verified against the public key, and tampered layouts (a
## changed layer, a swapped or edited SBOM, no signature, another key)
## refused; go install github.com/evercert/evercert/cmd/evercert@<HEAD's
## pseudo-version> from a GOPROXY directory of the committed HEAD, outside
## any module, and the binary run as kubectl-evercert found on PATH (the
## kubectl plugin rule; kubectl itself is not installed). Fails if a test
## did not run.
## Without -race: the evercert code under test runs in the example binaries,
## child processes built with CGO_ENABLED=0 (never race-instrumented); the
## test process holds only the harness (kustomize, client-go,
## go-containerregistry, internal/pki, proctest, testcluster), and -race made
## it gzip each image's layer several times slower. -parallel 4: the four
## examples of TestImagesServe wait on their child processes side by side.
DEPLOY_TESTS := TestHelmChartLint TestKustomizeBasesAreTheChartRendered TestHelmChartValues TestHelmChartInstall TestHelmChartRefusesBrokenValues TestHelmChartAcceptsValidValues TestHelmChartLifecycle TestKustomizeOverlayPolicyRollsPods TestBasesFollowTheRules TestManifestFlagsExist TestKustomizeBasesServerSideApply TestServiceAccountPermissions TestImagesServe TestBuildAllRefusesBinaryNameClash TestImageIsReproducible TestImageAttestationsVerify TestImageVerifyRefusesTampering TestGoInstallAndKubectlPlugin
test-deploy: kube-bin
	@mkdir -p $(CURDIR)/tmp
	cd test/deploy && $(CURDIR)/hack/gotest.sh $(CURDIR)/tmp/deploy.log env EVERCERT_KUBE_BIN=$(CURDIR)/hack/tools/bin $(GO) test -count=1 -parallel 4 -v -timeout 30m ./...
	@for t in $(DEPLOY_TESTS); do grep -qE "^--- PASS: $$t " $(CURDIR)/tmp/deploy.log || { echo "test-deploy: $$t did not run"; cat $(CURDIR)/tmp/deploy.log; exit 1; }; done
	@grep -E '^(--- |ok )' $(CURDIR)/tmp/deploy.log

## generate-kustomize: write the kustomize bases of deploy/kustomize from
## the Helm charts of deploy/helm rendered with their default values (the
## charts are the source; TestKustomizeBasesAreTheChartRendered fails until
## this has run after a chart changed).
generate-kustomize:
	cd test/deploy && $(GO) run ./cmd/kustomize-bases --repo-root $(CURDIR)

## image: the examples' container images (static binaries on an empty base,
## user 65532), built reproducibly without a Docker daemon or a base image
## pull, each written as an OCI image layout in tmp/images/<name> with its
## CycloneDX SBOM and in-toto SLSA provenance attached as OCI referrers.
## IMAGE_ARGS go to the builder, e.g. IMAGE_ARGS='--signing-key cosign.key'
## (a PEM ECDSA P-256 key: signs each image, SBOM and provenance; without
## it they are not signed, and it says so) or
## IMAGE_ARGS='--examples webhook --push REGISTRY/evercert/example-{name}:v1'.
## Verify a layout: cd test/deploy && go run ./cmd/image verify --layout
## ../../tmp/images/webhook --public-key cosign.pub
IMAGE_ARGS ?=
image:
	cd test/deploy && $(GO) run ./cmd/image --repo-root $(CURDIR) --out $(CURDIR)/tmp/images $(IMAGE_ARGS)

## test-migrate: switching to evercert from OPA cert-controller, cert-manager's
## webhook CA and knative's webhook certificates with no outage: each tool
## runs for real and writes its Secret, then evercert replicas adopt it
## (authority.Config.Adopt) while the real kube-apiserver calls a webhook
## (failurePolicy Fail); 0 failed calls across the switch and the first
## observed CA rotation; and (TestMigrateFrom{CertController,CertManager,Knative}WhileItRotates)
## with the old tool still writing while the replicas start (issue 27 §8):
## held, reported, then adopted once, 0 failed calls once it stopped, and once
## the retirements it recorded are due ca.crt holds only what a rule keeps for
## good (docs/migrating.md). The tests run two at a time, and the
## cert-controller overlap beside them in its own process
## (MIGRATE_OWN_PROCESS): the tests mostly wait on the real clock, and run
## after it they added 178 s to a CI run. The package is built once first
## so that the two processes do not compile it twice.
## test/migrate is its own module, so the library takes
## none of the tools' dependencies. Fails if a test did not run.
## -race stays: the adopting Authority replicas run in the test process.
MIGRATE_TESTS := TestMigrateFromCertController TestMigrateFromCertManager TestMigrateFromKnative TestMigrateFromCertControllerWhileItRotates TestMigrateFromCertManagerWhileItRotates TestMigrateFromKnativeWhileItRotates
# cert-controller's AddRotator registers a controller named cert-rotator
# with controller.NewUnmanaged, which controller-runtime allows once per
# process (the manager's SkipNameValidation does not reach it): the second
# test that runs cert-controller gets its own test process.
MIGRATE_OWN_PROCESS := TestMigrateFromCertControllerWhileItRotates
test-migrate: kube-bin
	@mkdir -p $(CURDIR)/tmp
	cd test/migrate && $(GO) test -race -count=1 -run '^$$' ./... >/dev/null
	cd test/migrate && { \
		$(CURDIR)/hack/gotest.sh $(CURDIR)/tmp/migrate-own.log env EVERCERT_KUBE_BIN=$(CURDIR)/hack/tools/bin $(GO) test -race -count=1 -v -timeout 20m -run '^$(MIGRATE_OWN_PROCESS)$$' ./... & own=$$!; \
		$(CURDIR)/hack/gotest.sh $(CURDIR)/tmp/migrate.log env EVERCERT_KUBE_BIN=$(CURDIR)/hack/tools/bin $(GO) test -race -count=1 -v -timeout 30m -skip '^$(MIGRATE_OWN_PROCESS)$$' ./...; rc=$$?; \
		wait $$own || rc=1; exit $$rc; }
	@for t in $(MIGRATE_TESTS); do cat $(CURDIR)/tmp/migrate.log $(CURDIR)/tmp/migrate-own.log | grep -qE "^--- PASS: $$t " || { echo "test-migrate: $$t did not run"; cat $(CURDIR)/tmp/migrate.log $(CURDIR)/tmp/migrate-own.log; exit 1; }; done
	@cat $(CURDIR)/tmp/migrate.log $(CURDIR)/tmp/migrate-own.log | grep -E '^(--- |    \w+_test.go:[0-9]+: \S+ migration:)'

## test-operator-e2e: the sample operator (controllerruntime/example/operator,
## its certificates from one evercert.Add call) as three replicas, separate
## processes behind a round-robin proxy, against a real kube-apiserver and
## etcd: admission and conversion webhook calls through at least three CA
## rotations with 0 failures, one replica SIGKILLed and restarted
## mid-rotation, and the API requests per replica per minute (logged); the
## README's lines-of-code table checked against the code; the
## cert-controller version of the operator compiled. Fails if a test did not
## run.
## Without -race: the operator replicas are child processes (proctest.Build,
## never race-instrumented); the test process holds only the harness (the
## round-robin proxy, client-go, testcluster), which -race only slowed.
OPERATOR_TESTS := TestE2EOperatorReplicas TestE2EOperatorSteadyState TestREADMELinesOfCode
test-operator-e2e: kube-bin
	@mkdir -p $(CURDIR)/tmp
	cd controllerruntime/example/certcontroller && $(GO) build -o /dev/null .
	cd controllerruntime && $(CURDIR)/hack/gotest.sh $(CURDIR)/tmp/operator-e2e.log env EVERCERT_KUBE_BIN=$(CURDIR)/hack/tools/bin $(GO) test -tags e2e -count=1 -v -timeout 15m ./e2e/ ./example/operator/
	@for t in $(OPERATOR_TESTS); do grep -qE "^--- PASS: $$t " $(CURDIR)/tmp/operator-e2e.log || { echo "test-operator-e2e: $$t did not run"; cat $(CURDIR)/tmp/operator-e2e.log; exit 1; }; done
	@grep -E '^--- |lines of certificate wiring|API requests of|CA rotations in|SIGKILLed|restarted and ready' $(CURDIR)/tmp/operator-e2e.log

## test-cli: the operators' CLI (cmd/evercert, build tag e2e) run as a
## child process against a real kube-apiserver and etcd from hack/tools/bin:
## status with two Authority replicas and a published webhook (text and
## JSON), rotate and rotate --compromised (the annotations, --wait, usage
## errors), check against a TLS server on 127.0.0.1 (exit 0 and 3), and
## rotate --compromised --wait right after example server replicas (separate
## processes) were SIGKILLed and restarted or replaced, whose time from the
## mark to handled it prints. Fails if any named test did not pass.
## -race stays: the two Authority replicas run in the test process (the
## CLI is a child process).
CLI_TESTS := TestCLIStatus TestCLIStatusLongSecretName TestCLIRotate TestCLIRotateActedOnByAuthorities TestCLICheck TestCLIStatusRejectsForgedLeases TestCLIRotateReplacesIgnoredMark TestCLIRotateWaitSaysWhatItWaitsFor TestCLIRotateCompromisedAfterRestarts
test-cli: kube-bin
	@mkdir -p $(CURDIR)/tmp
	$(CURDIR)/hack/gotest.sh $(CURDIR)/tmp/cli.log env EVERCERT_KUBE_BIN=$(CURDIR)/hack/tools/bin $(GO) test -race -tags e2e -count=1 -v -timeout 10m -run '^TestCLI' ./cmd/evercert/
	@for t in $(CLI_TESTS); do grep -qE "^--- PASS: $$t " $(CURDIR)/tmp/cli.log || { echo "test-cli: $$t did not pass"; cat $(CURDIR)/tmp/cli.log; exit 1; }; done
	@grep -E '^(--- |ok )|emergency after restarts:' $(CURDIR)/tmp/cli.log

## soak-short: the soak tests in their short form (part of make test): one
## simulated year, one cycle of every fault scenario but those the simulator
## covers (rollouts, forged announcements: make soak runs them), 15 s on the
## real clock.
## The 100-replica scale scenario is left to make soak (minutes, not seconds).
soak-short:
	@$(MAKE) --no-print-directory soak-run SOAK_FLAGS="-race" SOAK_ARGS="-soak.duration=15s -soak.years=1 -soak.cycles=1 -soak.scale-replicas=0"

## soak: the long soak (not part of make test): ten simulated years of
## steps, ten simulated years of fault scenarios, 60 s on the real clock,
## and one cycle of the scale scenario with 100 replicas (API budget, CPU
## and heap per replica); then the authority package's scenario tests at full size
## (-authority.long: 10 replicas, 30 CA lifetimes, every hand edit),
## which make test runs smaller, as the simulator covers their state space.
LONG_SCENARIOS := TestPromotionWithinSecondsOfTheDelay|TestPromotionWithinSecondsOfAnOutage|TestAuthorityReplicasRotate|TestHandEditedBrokenSecretIsRepaired|$(SIM_COVERED)
soak:
	@$(MAKE) --no-print-directory soak-run SOAK_FLAGS="" SOAK_ARGS="-soak.duration=60s -soak.years=10 -soak.all"
	$(GO) test -race -count=1 -timeout 60m -run '^($(LONG_SCENARIOS))$$' ./authority/ -args -authority.long

# soak-run keeps the full log in tmp/soak.log and prints the soak reports
# (rotations, handshakes, requests, failures, goroutines and heap) and the
# results; on failure it prints the end of the log too.
soak-run:
	@mkdir -p $(CURDIR)/tmp
	$(CURDIR)/hack/gotest.sh $(CURDIR)/tmp/soak.log $(GO) test $(SOAK_FLAGS) -v -count=1 -timeout 60m -tags soak ./test/soak/... -args $(SOAK_ARGS)
	@grep -E '^(--- |ok |FAIL|PASS)|soak report' $(CURDIR)/tmp/soak.log

## test-alloc-server: a TLS connection to the example server allocates no
## more than one to a net/http server on a static tls.Config (without -race,
## like test-alloc). Fails if the test did not run.
test-alloc-server:
	@mkdir -p $(CURDIR)/tmp
	$(CURDIR)/hack/gotest.sh $(CURDIR)/tmp/alloc-server.log $(GO) test -count=1 -v -run '^TestPerConnectionAllocationsMatchStatic$$' ./example/server/
	@grep -E '^--- PASS: TestPerConnectionAllocationsMatchStatic ' $(CURDIR)/tmp/alloc-server.log || { echo 'test-alloc-server: TestPerConnectionAllocationsMatchStatic did not run'; cat $(CURDIR)/tmp/alloc-server.log; exit 1; }
	@grep -E '^    alloc_test' $(CURDIR)/tmp/alloc-server.log

## bench: benchmarks side by side with upstream and a static tls.Config; writes BENCHMARKS.md.
bench:
	hack/bench.sh

## docs-figures: re-measure the figures docs/measured.md quotes and rewrite
## its marked blocks ("<!-- figures:NAME begin -->"): hack/bench.sh (the
## runs of make bench, which also rewrites BENCHMARKS.md) and the soak of
## make soak without its scenario tests (soak-run, no -race), then
## hack/figures records their outputs in docs/figures/ and renders the
## blocks from them; go test ./docs/ checks the blocks against that record.
## Not part of make test. FIGURES_COUNT (default COUNT, 6) is the
## benchmark runs per family; FIGURES_COUNT=1 is the quick run: one run per
## family and a short soak (one cycle, one simulated year, 10 replicas in
## the scale scenario).
FIGURES_COUNT ?= $(COUNT)
FIGURES_SOAK_ARGS ?= $(if $(filter 1,$(FIGURES_COUNT)),-soak.duration=15s -soak.years=1 -soak.cycles=1 -soak.all -soak.scale-replicas=10,-soak.duration=60s -soak.years=10 -soak.all)
docs-figures:
	COUNT=$(FIGURES_COUNT) BENCHTIME=$(BENCHTIME) hack/bench.sh
	@$(MAKE) --no-print-directory soak-run SOAK_FLAGS="" SOAK_ARGS="$(FIGURES_SOAK_ARGS)"
	$(GO) run ./hack/figures -bench $(CURDIR)/tmp/bench -soak-log $(CURDIR)/tmp/soak.log -soak-command 'make soak-run SOAK_ARGS="$(FIGURES_SOAK_ARGS)"'

## fuzz: run each fuzz target for FUZZTIME (default 5m).
fuzz:
	hack/fuzz.sh

## verify: gofmt, go vet, staticcheck.
verify:
	hack/verify.sh

## run: the example server on the embedded self-signed default.
run:
	@mkdir -p $(CURDIR)/tmp
	$(GO) run ./example/server $(RUN_ARGS)

clean:
	rm -rf $(BIN) $(CURDIR)/tmp

include hack/e2e.mk
