# The README's two commands are `make run` and `make test`.
SHELL := /bin/bash
.DEFAULT_GOAL := run
SQLC := go run github.com/sqlc-dev/sqlc/cmd/sqlc@v1.31.1
STATICCHECK := go run honnef.co/go/tools/cmd/staticcheck@v0.8.2
GOCYCLO := go run github.com/fzipp/gocyclo/cmd/gocyclo@v0.6.0
export BLOBPLANE_DATA_DIR ?= $(CURDIR)/.data

.PHONY: run test check generate bench microbench build stop fmt

build: ## build every binary into ./bin
	go build -buildvcs=auto -o bin/ ./cmd/...

run: build ## start Postgres (if needed), migrate, run api + worker; Ctrl-C stops all
	scripts/run.sh

test: ## run every test (starts Postgres and MinIO as needed)
	scripts/test.sh

check: ## gofmt, go vet (here, and for macOS and Windows), staticcheck, cyclomatic complexity, sqlc freshness
	@out=$$(gofmt -l $$(git ls-files '*.go')); if [ -n "$$out" ]; then echo "gofmt needed:"; echo "$$out"; exit 1; fi
	go vet ./...
	GOOS=darwin go vet ./...
	GOOS=windows go vet ./...
	$(STATICCHECK) ./...
	$(GOCYCLO) -over 20 -ignore '_test.go|internal/dbsqlc' .
	$(SQLC) diff || { echo "sqlc output is stale: run make generate"; exit 1; }

generate: ## regenerate sqlc code
	$(SQLC) generate

bench: ## the benchmark suite: Blobplane beside the raw pipeline, MinIO, Distribution; minutes (BENCH_FLAGS=--quick: seconds); tables in bench/results/
	scripts/bench.sh $(BENCH_FLAGS)

microbench: ## every testing.B benchmark (go test -bench; BENCH=regexp BENCHTIME=1s)
	scripts/bench.sh --go

stop: ## stop the project-local Postgres
	scripts/pg.sh stop

fmt:
	gofmt -w $$(git ls-files '*.go')
