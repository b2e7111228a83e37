# Shortcuts for the scripts in scripts/, which are what the README and CI run.
.PHONY: demo test bench lint services stop

demo:
	scripts/demo

test:
	scripts/test

lint:
	test -z "$$(gofmt -l $$(git ls-files '*.go'))"
	go vet ./...
	go tool staticcheck ./...
	cd tests && go vet ./... && "$$(cd .. && go tool -n staticcheck)" ./...

bench:
	scripts/bench

services:
	@scripts/services

stop:
	scripts/services stop
