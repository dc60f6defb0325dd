#!/usr/bin/env bash
# Fetch NVIDIA's SASS disassembler without installing CUDA: Debian's nvidia-cuda-toolkit package
# (non-free) carries nvdisasm, and its 11.8 reads the sm_80/sm_90 cubins of today's ptxas. The
# package is downloaded (not installed) and nvdisasm alone unpacked into .tools/bin/.
#
#   bash scripts/get_nvdisasm.sh && export NVDISASM=$PWD/.tools/bin/nvdisasm
#   python scripts/kernel_report.py --arch sm_90      # the "loop FFMA" column filled in
set -euo pipefail
cd "$(dirname "$0")/.."
target=.tools/bin/nvdisasm
if [ -x "$target" ]; then echo "$target"; exit 0; fi
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
policy=$(apt-cache policy nvidia-cuda-toolkit 2>/dev/null || true)
if [[ "$policy" != *"Candidate: "[0-9]* ]]; then
  # the package lives in Debian's non-free component: add it for this download
  cat > /etc/apt/sources.list.d/minilms-nonfree.sources <<'SOURCES'
Types: deb
URIs: http://deb.debian.org/debian
Suites: bookworm
Components: contrib non-free
Signed-By: /usr/share/keyrings/debian-archive-keyring.gpg
SOURCES
  apt-get update -qq
fi
(cd "$work" && apt-get download -qq nvidia-cuda-toolkit 2>/dev/null)
dpkg-deb -x "$work"/nvidia-cuda-toolkit_*.deb "$work/x"
mkdir -p .tools/bin
cp "$work/x/usr/bin/nvdisasm" "$target"
"$target" --version | tail -1
echo "$target"
