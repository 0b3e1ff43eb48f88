# Sourced by the scripts: repository paths, build helper and the environment
# mpirun needs on these machines (oversubscription; running as root).
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1
export OMPI_MCA_rmaps_base_oversubscribe=1
export OPENBLAS_NUM_THREADS=1
JOBS="$(nproc 2>/dev/null || echo 2)"

# build DIR TYPE [cmake args...]: configures once, then builds everything.
build() {
  local dir=$1 type=$2; shift 2
  if [ ! -f "$dir/CMakeCache.txt" ]; then
    cmake -S "$ROOT" -B "$dir" -DCMAKE_BUILD_TYPE="$type" "$@"
  fi
  cmake --build "$dir" -j "$JOBS"
}
