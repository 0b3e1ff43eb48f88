// compare_params A.h5 B.h5 RTOL: exits 0 when ||A - B||_F / ||B||_F <= RTOL over all
// parameters, 1 otherwise; prints the measured difference.
#include "ckpt/model_file.h"

#include <cstdio>
#include <cstdlib>
#include <exception>

int main(int argc, char** argv) {
  if (argc != 4) {
    std::fprintf(stderr, "usage: compare_params A.h5 B.h5 RTOL\n");
    return 2;
  }
  try {
    const auto a = orpheus::ckpt::loadParams(argv[1]);
    const auto b = orpheus::ckpt::loadParams(argv[2]);
    const double rtol = std::atof(argv[3]);
    const double diff = orpheus::relativeDifference(a, b);
    std::printf("relative Frobenius difference %.3e (tolerance %.1e)\n", diff, rtol);
    return diff <= rtol ? 0 : 1;
  } catch (const std::exception& e) {
    std::fprintf(stderr, "compare_params: %s\n", e.what());
    return 2;
  }
}
