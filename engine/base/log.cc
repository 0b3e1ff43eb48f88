#include "engine/base/log.h"

#include "orpheus/config.h"

#include <spdlog/sinks/stdout_sinks.h>

#if ORPHEUS_HAVE_BLAS
extern "C" void openblas_set_num_threads(int) __attribute__((weak));
extern "C" int openblas_get_num_threads() __attribute__((weak));
#endif

namespace orpheus {

void setupLogging(int rank, const std::string& level) {
  auto logger = spdlog::get("orpheus");
  if (!logger) logger = spdlog::stderr_logger_mt("orpheus");
  logger->set_pattern(fmt::format("[rank {}] %l: %v", rank));
  logger->set_level(spdlog::level::from_str(level));
  spdlog::set_default_logger(logger);
}

void setBlasThreads(int threads) {
#if ORPHEUS_HAVE_BLAS
  if (openblas_set_num_threads != nullptr) openblas_set_num_threads(threads);
#else
  (void)threads;
#endif
}

int blasThreads() {
#if ORPHEUS_HAVE_BLAS
  if (openblas_get_num_threads != nullptr) return openblas_get_num_threads();
#endif
  return 1;
}

}  // namespace orpheus
