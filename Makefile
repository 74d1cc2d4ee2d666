# berth: `make run` builds and serves with the embedded defaults; `make test`
# runs every test (as root; CI=true turns privileged skips into failures).
export CGO_ENABLED := 0
GO      ?= go
BIN     := bin/berth
# The lean guest (cmd/berth-guest) is built first and embedded in berth.
GUEST   := internal/guestbin/berth-guest
STATE   ?= /var/lib/berth
LISTEN  ?= 127.0.0.1:7680
PKGS    := ./...

.PHONY: build runsc run install install-bin test test-go test-python test-typescript test-e2b test-deps vet bench bench-deps bench-go fuzz clean

build: dashboard-assets
	$(GO) build -trimpath -o $(GUEST) ./cmd/berth-guest
	$(GO) build -trimpath -tags berth_guest_embedded -ldflags "-X github.com/berthsh/berth/internal/guestbin.sum=$$(sha256sum $(GUEST) | cut -d' ' -f1)" -o $(BIN) ./cmd/berth
	@chmod 0755 bin $(BIN)

# gVisor's runsc for the gvisor runtime, pinned by go.mod and built once into
# a cache outside the clone (scripts/runsc.sh); bin/runsc links to it.
runsc:
	@mkdir -p bin
	ln -sfn "$$(./scripts/runsc.sh)" bin/runsc

# install-bin puts the binary on PATH so that `berth run -- echo hello` works
# from any shell once the daemon is up (make run uses it). install adds the
# systemd unit (its ExecStart pointing at the installed binary) and the
# example config, all commented out, which it never writes over an existing
# one (docs/operate.md). DESTDIR stages the whole tree elsewhere.
PREFIX  ?= /usr/local
UNITDIR ?= /lib/systemd/system
CONFDIR ?= /etc/berth

install-bin: build
	install -D -m 0755 $(BIN) $(DESTDIR)$(PREFIX)/bin/berth

install: install-bin
	install -d -m 0755 $(DESTDIR)$(UNITDIR) $(DESTDIR)$(CONFDIR)
	sed -e 's|/usr/local/bin/berth|$(PREFIX)/bin/berth|' -e 's|/etc/berth/config.yaml|$(CONFDIR)/config.yaml|' \
		dist/systemd/berth.service > $(DESTDIR)$(UNITDIR)/berth.service
	chmod 0644 $(DESTDIR)$(UNITDIR)/berth.service
	@if [ -e $(DESTDIR)$(CONFDIR)/config.yaml ]; then \
		echo "$(DESTDIR)$(CONFDIR)/config.yaml exists: kept (the example is dist/berth/config.yaml)"; \
	else \
		install -m 0644 dist/berth/config.yaml $(DESTDIR)$(CONFDIR)/config.yaml; \
	fi

run: install-bin runsc
	exec $(PREFIX)/bin/berth serve --state-dir $(STATE) --listen $(LISTEN) --runsc $(CURDIR)/bin/runsc

vet:
	$(GO) vet $(PKGS)
	@test ! -f $(GUEST) || $(GO) vet -tags berth_guest_embedded ./internal/guestbin/
	@test -z "$$(gofmt -l $$(git ls-files '*.go' 2>/dev/null || find . -name '*.go'))" || (echo "gofmt needed:"; gofmt -l .; exit 1)

# Programs the tests run inside sandboxes must be in the host's /usr.
test-deps:
	./scripts/test-deps.sh

test: test-go test-python test-typescript test-e2b

test-go: build vet test-deps runsc
	BERTH_BINARY=$(CURDIR)/$(BIN) BERTH_RUNSC=$(CURDIR)/bin/runsc $(GO) test -count=1 -timeout 20m $(PKGS)

# The Python SDK and its deepagents backend, in a virtual environment made
# here with packages from PyPI (pinned in sdk/python/pyproject.toml), against
# a real daemon: the SDK's tests, LangChain's sandbox suite, an agent run.
VENV := sdk/python/.venv
$(VENV)/.installed: sdk/python/pyproject.toml
	python3 -m venv $(VENV)
	$(VENV)/bin/pip install -q --disable-pip-version-check -e 'sdk/python[test]'
	touch $@

# It runs twice: on the native runtime, then with gvisor as the daemon's
# default (runtime-specific tests name theirs).
test-python: build test-deps runsc $(VENV)/.installed
	cd sdk/python && BERTH_BINARY=$(CURDIR)/$(BIN) BERTH_RUNSC=$(CURDIR)/bin/runsc .venv/bin/python -m pytest -p no:cacheprovider -rfEx tests
	cd sdk/python && BERTH_TEST_RUNTIME=gvisor BERTH_BINARY=$(CURDIR)/$(BIN) BERTH_RUNSC=$(CURDIR)/bin/runsc .venv/bin/python -m pytest -p no:cacheprovider -rfEx tests

# The OpenAI Agents SDK sandbox client (berth.openai_agents) alone, on both
# runtimes; test-python runs the same file with the rest of the suite.
.PHONY: test-openai-agents
test-openai-agents: build test-deps runsc $(VENV)/.installed
	cd sdk/python && BERTH_BINARY=$(CURDIR)/$(BIN) BERTH_RUNSC=$(CURDIR)/bin/runsc .venv/bin/python -m pytest -p no:cacheprovider -rfEx tests/test_openai_agents.py
	cd sdk/python && BERTH_TEST_RUNTIME=gvisor BERTH_BINARY=$(CURDIR)/$(BIN) BERTH_RUNSC=$(CURDIR)/bin/runsc .venv/bin/python -m pytest -p no:cacheprovider -rfEx tests/test_openai_agents.py

# E2B's own SDKs, as users install them (Python e2b from PyPI, the npm
# package e2b; pinned in compat/e2b/sdktest), run unchanged against a real
# daemon: berth's E2B compatibility (docs/e2b.md).
E2B_TEST := compat/e2b/sdktest
$(E2B_TEST)/.venv/.installed: $(E2B_TEST)/requirements.txt
	python3 -m venv $(E2B_TEST)/.venv
	$(E2B_TEST)/.venv/bin/pip install -q --disable-pip-version-check -r $(E2B_TEST)/requirements.txt
	touch $@
$(E2B_TEST)/node/node_modules/.installed: $(E2B_TEST)/node/package-lock.json
	cd $(E2B_TEST)/node && npm ci --no-audit --no-fund --loglevel=error
	touch $@

test-e2b: build test-deps $(E2B_TEST)/.venv/.installed $(E2B_TEST)/node/node_modules/.installed
	cd $(E2B_TEST)/python && BERTH_BINARY=$(CURDIR)/$(BIN) ../.venv/bin/python -m pytest -p no:cacheprovider -rfEx .
	cd $(E2B_TEST)/node && BERTH_BINARY=$(CURDIR)/$(BIN) node --test --test-concurrency=1 e2b.test.mjs

# The TypeScript SDK (sdk/typescript, the npm package @berthsh/berth),
# installed from package-lock.json with npm ci, compiled by tsc, and tested
# with Node's test runner against a real daemon that the tests start (its
# quickstart example included).
TS_SDK := sdk/typescript
$(TS_SDK)/node_modules/.installed: $(TS_SDK)/package-lock.json
	cd $(TS_SDK) && npm ci --no-audit --no-fund --loglevel=error
	touch $@

.PHONY: test-typescript
test-typescript: build test-deps $(TS_SDK)/node_modules/.installed
	cd $(TS_SDK) && ./node_modules/.bin/tsc -p tsconfig.json
	cd $(TS_SDK) && BERTH_BINARY=$(CURDIR)/$(BIN) node --test --test-concurrency=1 --test-timeout=300000 test/*.test.mjs

# The benchmark suite: berth beside crun, runc, runsc, bwrap and podman in
# one run of interleaved rounds (bench/main.go says how), and through E2B's
# Python SDK (the venv above). It writes bench/results/latest.{md,json} and
# the table in README.md.
bench-deps:
	./scripts/bench-deps.sh

bench: build bench-deps runsc $(E2B_TEST)/.venv/.installed
	$(GO) run ./bench -berth $(BIN) -readme README.md $(BENCHFLAGS)

# The Go benchmarks of the e2e package (one metric at a time, no peers).
bench-go: build
	BERTH_BINARY=$(CURDIR)/$(BIN) $(GO) test -run '^$$' -bench . -benchtime 200x -timeout 20m ./e2e/

clean:
	rm -rf bin $(GUEST) dashboard/web/node_modules dashboard/assets/vendor $(VENV) $(E2B_TEST)/.venv $(E2B_TEST)/node/node_modules $(TS_SDK)/node_modules $(TS_SDK)/dist

# The dashboard's browser libraries (xterm.js and its fit addon), from npm
# at the versions dashboard/web/package-lock.json pins, copied into
# dashboard/assets/vendor (git-ignored) for go:embed; a build without them
# serves a dashboard whose terminal says it is unavailable.
DASH_WEB    := dashboard/web
DASH_VENDOR := dashboard/assets/vendor/xterm
.PHONY: dashboard-assets
dashboard-assets: $(DASH_VENDOR)/.installed
$(DASH_VENDOR)/.installed: $(DASH_WEB)/package-lock.json
	cd $(DASH_WEB) && npm ci --no-audit --no-fund --loglevel=error
	mkdir -p $(DASH_VENDOR)
	sed '/sourceMappingURL=/d' $(DASH_WEB)/node_modules/@xterm/xterm/lib/xterm.mjs > $(DASH_VENDOR)/xterm.mjs
	sed '/sourceMappingURL=/d' $(DASH_WEB)/node_modules/@xterm/addon-fit/lib/addon-fit.mjs > $(DASH_VENDOR)/addon-fit.mjs
	cp $(DASH_WEB)/node_modules/@xterm/xterm/css/xterm.css $(DASH_VENDOR)/xterm.css
	cp $(DASH_WEB)/node_modules/@xterm/xterm/LICENSE $(DASH_VENDOR)/LICENSE
	touch $@

# The dashboard alone: its handler's tests, and e2e/dashboard_test.go in a
# real headless chromium against a real daemon. With
# BERTH_DASHBOARD_SCREENSHOTS=$(CURDIR)/docs/dashboard it rewrites the
# screenshots of docs/dashboard.md. (make test-go runs the same tests.)
.PHONY: test-dashboard
test-dashboard: build test-deps
	BERTH_BINARY=$(CURDIR)/$(BIN) $(GO) test -count=1 -timeout 10m -run Dashboard ./dashboard/ ./e2e/

# The security review's attacks on keys, tenants and the audit log alone
# (make test-go runs the same tests): the edge's and the keyring's over a
# real store, and e2e/security_review_test.go against a real daemon.
.PHONY: test-security-review
test-security-review: build test-deps
	$(GO) test -count=1 -run 'TestKeyIsNeverRelayed|TestKeyInAPathStaysSecret|TestRefusalsDoNotFillTheAuditTable|TestRedact|TestFarExpiryIsRefused|TestOneTenantCannotPushOutAnother' ./server/ ./auth/ ./audit/
	BERTH_BINARY=$(CURDIR)/$(BIN) $(GO) test -count=1 -timeout 10m -run 'TestReview' ./e2e/
