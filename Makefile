# bcd: the two commands that matter are `make demo` (real PXE-booting VMs taken through their
# life) and `make test`. Everything else is a building block of those.
SHELL := /bin/bash
GO ?= go
BIN := bin/bcd
DATA ?= data

.PHONY: all build run demo demo-down test test-e2e test-unit test-race generate lint bench-api apt-test-deps pg clean

all: build

build:
	$(GO) build -o $(BIN) ./cmd/bcd

# Starts bcd server on the embedded SQLite store in ./data; prints the API address and, on
# first start, an admin token.
run: build
	$(BIN) server --data-dir $(DATA)

# Every test, as CI runs it: installs the Debian packages the tests drive (as root), starts
# PostgreSQL for the PostgreSQL half of the store suite, then runs the race-enabled suite.
# As root it also builds the ramdisk and the lab OS image: the end-to-end test boots them.
test: build
	@if [ "$$(id -u)" = 0 ]; then ./.ci/apt-test-deps && $(MAKE) --no-print-directory ramdisk lab-image; fi
	@if [ -z "$$BCD_TEST_POSTGRES_DSN" ] && [ "$$(id -u)" = 0 ]; then \
		dsn=$$(./.ci/pg-start) || exit 1; export BCD_TEST_POSTGRES_DSN="$$dsn"; fi; \
	$(GO) test -race -count=1 -timeout 50m ./...

# The end-to-end test alone (root): two VMs through their whole life.
test-e2e: build
	@./.ci/apt-test-deps
	@$(MAKE) --no-print-directory ramdisk lab-image
	$(GO) test -count=1 -timeout 50m -v -run TestEndToEnd ./internal/lab/scenario

# The demo (root): installs what is missing (Debian's qemu-system-x86, ipxe, ipxe-qemu, ovmf,
# syslinux… without recommends), builds bcd, the ramdisk and the lab image, starts bcd server
# with a lab of two VMs and a site agent, and takes the VMs from enroll to deployed. It leaves
# everything running; `make demo-down` stops it.
demo: build
	@[ "$$(id -u)" = 0 ] || { echo "make demo needs root (network namespaces, taps, QEMU)"; exit 1; }
	@./.ci/apt-test-deps
	@$(MAKE) --no-print-directory ramdisk lab-image
	$(BIN) lab demo

demo-down:
	$(BIN) lab demo-down

test-unit:
	$(GO) test -count=1 ./...

# Regenerates protobuf/ConnectRPC code and the web UI's templ code (committed; CI does not
# need the generators).
generate:
	$(GO) tool buf generate
	$(GO) tool templ generate -path internal/webui

lint:
	@test -z "$$(gofmt -l cmd internal)" || (gofmt -l cmd internal; exit 1)
	$(GO) vet ./...

bench-api: build
	$(BIN) bench api --nodes 10000 --clients 8

pg:
	@./.ci/pg-start

clean:
	rm -rf bin

# --- ramdisk ------------------------------------------------------------------------------
# `make ramdisk` → out/ramdisk/vmlinuz + out/ramdisk/initramfs.cpio.gz (x86-64). The kernel is
# Debian's linux-image-*-amd64, downloaded into out/cache once (never committed). RAMDISK_MAIN
# is the static binary that becomes /init: bcd itself (started with no arguments as PID 1, it
# runs `bcd ramdisk init`).
RAMDISK_MAIN ?= ./cmd/bcd
RAMDISK_OUT ?= out/ramdisk
RAMDISK_CACHE ?= out/cache

.PHONY: ramdisk ramdisk-kernel-deb
ramdisk-kernel-deb:
	@./scripts/ramdisk/kernel-deb $(RAMDISK_CACHE) >/dev/null

ramdisk: ramdisk-kernel-deb
	mkdir -p $(RAMDISK_OUT)
	CGO_ENABLED=0 $(GO) build -trimpath -buildvcs=false -ldflags='-s -w' -o $(RAMDISK_CACHE)/ramdisk-init $(RAMDISK_MAIN)
	$(RAMDISK_CACHE)/ramdisk-init ramdisk build --kernel-deb "$$(./scripts/ramdisk/kernel-deb $(RAMDISK_CACHE))" \
		--binary $(RAMDISK_CACHE)/ramdisk-init --out $(RAMDISK_OUT)

# --- lab OS image ---------------------------------------------------------------------------
# `make lab-image` → out/lab/os.img (raw disk: MBR + FAT ESP with syslinux for BIOS and UEFI),
# out/lab/os.img.zst (what the catalog serves), out/lab/manifest.json (name, format,
# compression, size, sha256 for `bcd image add`) and, made once and kept, the lab signer
# out/lab/signer.key + signer.pub. Same kernel package and binary as the ramdisk: the image's
# /init is bcd, which runs as the installed OS when the kernel command line says bcd.role=os.
LAB_IMAGE_OUT ?= out/lab
# Extra kernel arguments of the image, e.g. bcd.metadata=http://IP:PORT/metadata when the site
# agent's boot HTTP is not on port 80 of the DHCP server, or bcd.state=partition.
LAB_IMAGE_CMDLINE ?=

.PHONY: lab-image
lab-image: ramdisk-kernel-deb
	@./scripts/lab/image-deps
	mkdir -p $(LAB_IMAGE_OUT)
	CGO_ENABLED=0 $(GO) build -trimpath -buildvcs=false -ldflags='-s -w' -o $(RAMDISK_CACHE)/ramdisk-init $(RAMDISK_MAIN)
	$(RAMDISK_CACHE)/ramdisk-init lab image build --kernel-deb "$$(./scripts/ramdisk/kernel-deb $(RAMDISK_CACHE))" \
		--binary $(RAMDISK_CACHE)/ramdisk-init --out $(LAB_IMAGE_OUT) --cmdline "$(LAB_IMAGE_CMDLINE)"
