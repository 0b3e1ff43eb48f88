#!/usr/bin/env bash
# bundle.sh DIR: a self-contained Orpheus in DIR (and DIR.tar.xz and DIR-data.tar beside it) that
# runs `orpheus`, the CUDA plugin and the GPU tests on any x86-64 Linux with glibc
# >= 2.36, an NVIDIA driver and the CUDA 13 libraries, and nothing else installed:
# no MPI, HDF5 or BLAS. What it holds:
#   bin/      orpheus, liborpheus_cuda.so (next to it, where orpheus looks), the
#             test and check binaries the GPU check runs, an mpirun wrapper, and
#             iproute2's ip and tc (for scripts/netcluster.sh, where the host permits it)
#   lib/      every shared library they need beyond glibc, libstdc++, libgcc and
#             CUDA; the binaries find it through $ORIGIN-relative RUNPATHs
#   mpi/      Debian's Open MPI, relocated (extracted packages; env.sh sets the
#             paths and the three settings a bare container needs)
#   env.sh    `source DIR/env.sh`: the paths, and the CUDA and cuDNN libraries found
#             on the host (a CUDA install's lib64, or a Python wheel's nvidia/*/lib)
#   data/     Fashion-MNIST's test set and the first TRAIN_EXAMPLES training images, and the
#             KJV token files (scripts/data/make_tokens.sh, vocabulary 2000, 35 steps) and bag
#             of words (scripts/data/make_corpus.sh, blocks of 30 verses, 500 words)
#   data/refs the cpu jobs of scripts/gpu_check.sh whose outputs are small, run here with
#             these binaries (REFS=0 leaves them out): the GPU host does not run them again
#   examples/ the .loss models
# CUDA's own libraries and cuDNN are never shipped (libcublasLt alone is 517 MiB).
# Builds a stripped Release tree in $BUILD_DIR (default build-bundle) first.
set -euo pipefail
source "$(dirname "${BASH_SOURCE[0]}")/common.sh"

[ $# -eq 1 ] || { echo "usage: scripts/bundle.sh DIR" >&2; exit 2; }
dest=$(realpath -m "$1")
case "$dest" in "$ROOT"|"$ROOT"/scripts*|"$ROOT"/engine*|"$ROOT"/ops*|/) echo "bundle.sh: refusing to write into $dest" >&2; exit 2 ;; esac
build_dir=${BUILD_DIR:-$ROOT/build-bundle}
train_examples=${TRAIN_EXAMPLES:-30000}
fmnist=${FASHION_MNIST:-/usr/share/datasets/fashion-mnist}
mpi_packages=(openmpi-bin openmpi-common libopenmpi3 libpmix2 libevent-core-2.1-7 libevent-pthreads-2.1-7 libhwloc15
  libhwloc-plugins libfabric1 libibverbs1 libnl-3-200 librdmacm1 libpsm-infinipath1 libpsm2-2 libucx0)

"$ROOT/scripts/setup.sh"
if ! command -v patchelf >/dev/null; then
  echo "bundle.sh: installing patchelf"
  apt-get install -y -qq --no-install-recommends patchelf >/dev/null || { apt-get update -qq && apt-get install -y -qq --no-install-recommends patchelf >/dev/null; }
fi

build "$build_dir" Release -DORPHEUS_WITH_CUDA=AUTO
[ -f "$build_dir/engine/liborpheus_cuda.so" ] || echo "bundle.sh: note: this build has no CUDA backend (no nvcc?)" >&2

rm -rf "$dest" "$dest.tar.xz" "$dest-data.tar"
mkdir -p "$dest"/{bin,lib,mpi,data/fashion-mnist,examples}
binaries=("$build_dir/engine/orpheus" "$build_dir/tests/compare_params" "$build_dir/tests/check_metrics"
  "$build_dir/tests/test_backend" "$build_dir/tests/test_backend_cuda" "$build_dir/tests/test_strict_backend"
  "$build_dir/tests/test_rebuild" "$build_dir/tests/rebuild_rate")
[ -f "$build_dir/engine/liborpheus_cuda.so" ] && binaries+=("$build_dir/engine/liborpheus_cuda.so")
# Our LSTM against cuDNN's: built where cuDNN was found; cuDNN itself is found on the host (env.sh).
[ -f "$build_dir/tests/test_lstm_cudnn" ] && binaries+=("$build_dir/tests/test_lstm_cudnn")
# iproute2's ip and tc, where this host has them: scripts/netcluster.sh's emulated network
# (namespaces, veths, tc) on a host that lacks them, where it permits namespaces at all.
for tool in ip tc; do
  path=$(command -v "$tool" || true)
  [ -n "$path" ] && binaries+=("$(readlink -f "$path")") || echo "bundle.sh: note: no $tool here, none bundled" >&2
done
for b in "${binaries[@]}"; do
  cp "$b" "$dest/bin/"
  strip --strip-unneeded "$dest/bin/$(basename "$b")"
done

# Open MPI, relocated: Debian's packages extracted as they are.
debs=$(mktemp -d); trap 'rm -rf "$debs"' EXIT
(cd "$debs" && apt-get download "${mpi_packages[@]}" >/dev/null 2>&1) || {
  apt-get update -qq && (cd "$debs" && apt-get download "${mpi_packages[@]}" >/dev/null)
}
for d in "$debs"/*.deb; do dpkg -x "$d" "$dest/mpi"; done
rm -rf "$dest/mpi/usr/share/doc" "$dest/mpi/usr/share/man" "$dest/mpi/usr/share/lintian"
mpi_lib=$dest/mpi/usr/lib/x86_64-linux-gnu

# Every library the binaries load, but glibc's, the compiler runtime's (the host's
# are newer), CUDA's and what the relocated Open MPI provides.
skip='^(linux-vdso|ld-linux|libc\.|libm\.|libpthread|libdl\.|librt\.|libresolv|libutil|libanl|libstdc\+\+|libgcc_s|libcuda|libcublas|libcudnn|libnvrtc|libnvJitLink)'
for b in "$dest"/bin/*; do
  ldd "$b" 2>/dev/null | awk '$2 == "=>" && $3 ~ /^\// {print $1, $3}'
done | sort -u | while read -r name path; do
  [[ "$name" =~ $skip ]] && continue
  [ -e "$mpi_lib/$name" ] && continue
  cp -L "$path" "$dest/lib/$name"
done
# The binaries find lib/ and the relocated Open MPI beside them, wherever the bundle lies.
for b in "$dest"/bin/*; do
  patchelf --set-rpath '$ORIGIN:$ORIGIN/../lib:$ORIGIN/../mpi/usr/lib/x86_64-linux-gnu' "$b"
done
for l in "$dest"/lib/*; do patchelf --set-rpath '$ORIGIN' "$l" 2>/dev/null || true; done

# Data: the test set whole, the training set cut to its first $train_examples images.
cp "$fmnist"/t10k-images-idx3-ubyte.gz "$fmnist"/t10k-labels-idx1-ubyte.gz "$dest/data/fashion-mnist/"
/usr/bin/python3 - "$fmnist" "$dest/data/fashion-mnist" "$train_examples" <<'EOF'
import gzip, struct, sys
src, dst, n = sys.argv[1], sys.argv[2], int(sys.argv[3])
for name, header, item in (("train-images-idx3-ubyte.gz", 16, 784), ("train-labels-idx1-ubyte.gz", 8, 1)):
    data = gzip.open(f"{src}/{name}").read()
    head = bytearray(data[:header])
    count = min(n, struct.unpack(">I", head[4:8])[0])
    head[4:8] = struct.pack(">I", count)
    with gzip.open(f"{dst}/{name}", "wb", compresslevel=9) as f:
        f.write(bytes(head) + data[header:header + count * item])
EOF
"$ROOT/scripts/data/make_tokens.sh" "$dest/data/kjv" --vocab 2000 --steps 35
"$ROOT/scripts/data/make_corpus.sh" "$dest/data/kjv-bow" --block 30 --vocab 500
cp "$ROOT"/examples/*.loss "$dest/examples/"

cat >"$dest/env.sh" <<'EOF'
# source env.sh: Orpheus from this bundle on this host. Puts bin/ on PATH, points the
# relocated Open MPI at itself, and finds the CUDA 13 libraries the GPU backend needs
# ($ORPHEUS_CUDA_LIBS, a CUDA install's lib64, or a Python wheel's nvidia/*/lib).
ORPHEUS_BUNDLE=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
export ORPHEUS_BUNDLE
_m=$ORPHEUS_BUNDLE/mpi
export OPAL_PREFIX=$_m/usr OPAL_SYSCONFDIR=$_m/etc/openmpi
export PMIX_PREFIX=$_m/usr/lib/x86_64-linux-gnu/pmix2
export PMIX_MCA_mca_base_component_path=$_m/usr/lib/x86_64-linux-gnu/pmix2/lib/pmix
# A bare container: no ssh/rsh for mpirun's launcher, root, no ptrace-based single copy.
export OMPI_MCA_plm=^rsh OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1
export OMPI_MCA_btl_vader_single_copy_mechanism=none OMPI_MCA_rmaps_base_oversubscribe=1
# A host with another PMIx's plugins in the system folder: no warning about them.
export PMIX_MCA_mca_base_component_show_load_errors=0 PMIX_MCA_pcompress_base_silence_warning=1
export OPENBLAS_NUM_THREADS=${OPENBLAS_NUM_THREADS:-1}
_cuda=""
for d in ${ORPHEUS_CUDA_LIBS:-} /usr/local/cuda/lib64 /usr/local/cuda-13*/lib64 /usr/local/cuda/targets/x86_64-linux/lib; do
  if [ -e "$d/libcublas.so.13" ] && [ -e "$d/libcudart.so.13" ]; then _cuda=$d; break; fi
done
if [ -z "$_cuda" ]; then
  for py in python3 /usr/bin/python3; do
    command -v "$py" >/dev/null 2>&1 || continue
    _wheels=$("$py" -c 'import glob, os, site
dirs = site.getsitepackages() + [site.getusersitepackages()]
libs = [d for s in dirs for d in glob.glob(os.path.join(s, "nvidia", "*", "lib"))]
print(":".join(sorted(set(libs))))' 2>/dev/null || true)
    case ":$_wheels:" in *cublas*) _cuda=$_wheels; break ;; esac
  done
fi
if [ -n "$_cuda" ]; then
  echo "env.sh: CUDA libraries from $_cuda" >&2
else
  echo "env.sh: no CUDA 13 libraries found (set ORPHEUS_CUDA_LIBS): --device cuda will say so" >&2
fi
export ORPHEUS_CUDA_LIBS_USED=$_cuda
# cuDNN 9, for test_lstm_cudnn only: $ORPHEUS_CUDNN_LIBS, beside CUDA's, the
# system's, or a Python wheel's nvidia/cudnn/lib.
_cudnn=""
for d in ${ORPHEUS_CUDNN_LIBS:-} ${_cuda//:/ } /usr/local/cuda/lib64 /usr/lib/x86_64-linux-gnu; do
  if [ -e "$d/libcudnn.so.9" ]; then _cudnn=$d; break; fi
done
if [ -z "$_cudnn" ]; then
  for py in python3 /usr/bin/python3; do
    command -v "$py" >/dev/null 2>&1 || continue
    _cudnn=$("$py" -c 'import glob, os, site
dirs = site.getsitepackages() + [site.getusersitepackages()]
print(next((d for s in dirs for d in glob.glob(os.path.join(s, "nvidia", "cudnn", "lib"))
            if os.path.exists(os.path.join(d, "libcudnn.so.9"))), ""))' 2>/dev/null || true)
    [ -n "$_cudnn" ] && break
  done
fi
if [ -n "$_cudnn" ]; then
  echo "env.sh: cuDNN from $_cudnn" >&2
  case ":$_cuda:" in *":$_cudnn:"*) ;; *) _cuda=$_cuda${_cuda:+:}$_cudnn ;; esac
else
  echo "env.sh: no cuDNN 9 found (set ORPHEUS_CUDNN_LIBS): test_lstm_cudnn cannot start" >&2
fi
# The host's own path, for programs that bring their libraries (PyTorch and its cuDNN).
export ORPHEUS_HOST_LD_LIBRARY_PATH=${ORPHEUS_HOST_LD_LIBRARY_PATH-${LD_LIBRARY_PATH:-}}
export LD_LIBRARY_PATH=$ORPHEUS_BUNDLE/lib:$_m/usr/lib/x86_64-linux-gnu${_cuda:+:$_cuda}${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}
export PATH=$ORPHEUS_BUNDLE/bin:$PATH
export FASHION_MNIST=$ORPHEUS_BUNDLE/data/fashion-mnist ORPHEUS_KJV=$ORPHEUS_BUNDLE/data/kjv ORPHEUS_KJV_BOW=$ORPHEUS_BUNDLE/data/kjv-bow
unset _m _cuda _cudnn _wheels
EOF
cat >"$dest/bin/mpirun" <<'EOF'
#!/usr/bin/env bash
# The bundle's Open MPI (source ../env.sh first, or let this do it).
here=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
[ -n "${ORPHEUS_BUNDLE:-}" ] || source "$here/env.sh"
exec "$here/mpi/usr/bin/mpirun.openmpi" "$@"
EOF
chmod +x "$dest/bin/mpirun"
cp "$dest/bin/mpirun" "$dest/bin/mpiexec"
git -C "$ROOT" rev-parse --short HEAD >"$dest/VERSION" 2>/dev/null || echo unknown >"$dest/VERSION"

# CPU references (data/refs): gpu_check.sh's cpu jobs whose outputs are small, run here
# with the bundle's own binaries (REFS_WRITE), so that a GPU host spends its minutes on
# the GPU. REFS=0: none.
if [ "${REFS:-1}" != 0 ]; then
  refs_out=$(mktemp -d)
  (
    source "$dest/env.sh" 2>/dev/null
    REFS=none REFS_WRITE="$dest/data/refs" DEVICE=strict BUDGET=1800 OUT="$refs_out" \
      SKIP_STEPS="memcheck sv_dense bitwise restore shared" "$ROOT/scripts/gpu_check.sh" >"$refs_out/console.txt" 2>&1
  ) || true
  mkdir -p "$dest/data/refs"
  echo "$(grep -m1 'model name' /proc/cpuinfo | cut -d: -f2- | sed 's/^ *//'), $(nproc) cores" >"$dest/data/refs/HOST"
  echo "bundle: $(find "$dest/data/refs" -name '*.key' | wc -l) cpu references in data/refs ($(du -sh "$dest/data/refs" | cut -f1))"
  rm -rf "$refs_out"
fi

# Two archives: the programs (xz), and the data (already gzip-compressed) to unpack beside them.
tar -C "$(dirname "$dest")" -cJf "$dest.tar.xz" --exclude="$(basename "$dest")/data" "$(basename "$dest")"
tar -C "$(dirname "$dest")" -cf "$dest-data.tar" "$(basename "$dest")/data"
echo "bundle: $dest ($(du -sh "$dest" | cut -f1)); $dest.tar.xz ($(du -h "$dest.tar.xz" | cut -f1), the programs)" \
  "and $dest-data.tar ($(du -h "$dest-data.tar" | cut -f1), Fashion-MNIST and KJV tokens): tar -xJf, tar -xf, source env.sh"
echo "newest glibc symbol needed: $(for b in "$dest"/bin/* "$dest"/lib/*; do objdump -T "$b" 2>/dev/null; done |
  grep -o 'GLIBC_2\.[0-9]*' | sort -t. -k2 -n -u | tail -1)"
