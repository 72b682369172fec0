#!/usr/bin/env bash
# build-tools.sh builds the control plane that package kubetest runs (etcd, kube-apiserver,
# kube-scheduler, kube-controller-manager) from the pinned module in tools/, and prints the directory that holds them.
#
# The directory is $ELASTICPS_KUBE_TOOLS when set (kubetest wants it absolute), else
# ${XDG_CACHE_HOME:-$HOME/.cache}/elasticps/kube/<key>, where <key> is the first 16 hex digits of
# the SHA-256 of tools/go.sum (kubetest computes the same key): a change of any version makes a
# new directory, a change of a comment in go.mod does not. A binary that is already there is not
# built again, so a second call costs nothing. The first costs about 25 CPU-minutes with an empty
# Go build cache, under a minute with a warm one. Binaries are built into a temporary directory
# and renamed into place, so an interrupted build leaves nothing half-written behind.
#
# Usage: dir=$(bash internal/kubetest/build-tools.sh)
set -euo pipefail

start=$(date +%s)
here=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
tools="$here/tools"

key=$(sha256sum <"$tools/go.sum" | cut -c1-16)
dir=${ELASTICPS_KUBE_TOOLS:-${XDG_CACHE_HOME:-$HOME/.cache}/elasticps/kube/$key}
mkdir -p "$dir"
dir=$(cd "$dir" && pwd) # the build runs elsewhere, and the caller gets a path that works anywhere

# name=package, built with `go build` in the tools module.
bins=(
  "etcd=go.etcd.io/etcd/server/v3"
  "kube-apiserver=k8s.io/kubernetes/cmd/kube-apiserver"
  "kube-scheduler=k8s.io/kubernetes/cmd/kube-scheduler"
  "kube-controller-manager=k8s.io/kubernetes/cmd/kube-controller-manager"
)

missing=()
for b in "${bins[@]}"; do
  [ -x "$dir/${b%%=*}" ] || missing+=("$b")
done

if [ ${#missing[@]} -gt 0 ]; then
  tmp=$(mktemp -d "$dir/.build.XXXXXX")
  trap 'rm -rf "$tmp"' EXIT
  cd "$tools"
  export GOWORK=off CGO_ENABLED=0
  # What /version reports; without it the apiserver calls itself v0.0.0-master.
  kv=$(go list -m -f '{{.Version}}' k8s.io/kubernetes)
  minor=${kv#v*.}
  minor=${minor%%.*}
  ldflags="-s -w -X k8s.io/component-base/version.gitVersion=$kv"
  ldflags+=" -X k8s.io/component-base/version.gitMajor=1 -X k8s.io/component-base/version.gitMinor=$minor"
  ldflags+=" -X k8s.io/component-base/version.gitTreeState=clean"
  for b in "${missing[@]}"; do
    name=${b%%=*}
    echo "build-tools: building $name" >&2
    go build -trimpath -buildvcs=false -ldflags "$ldflags" -o "$tmp/$name" "${b#*=}"
  done
  for b in "${missing[@]}"; do
    mv -f "$tmp/${b%%=*}" "$dir/${b%%=*}"
  done
fi

echo "build-tools: ${#missing[@]} of ${#bins[@]} binaries built in $(($(date +%s) - start))s" >&2
echo "$dir"
