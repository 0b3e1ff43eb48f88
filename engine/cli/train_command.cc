#include "engine/cli/commands.h"

#include "comm/factory.h"
#include "engine/base/log.h"
#include "engine/failures.h"
#include "engine/job/job.h"

#include <spdlog/spdlog.h>

#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <memory>

namespace orpheus::engine::cli {

int trainMain(TrainConfig& config, const std::vector<std::string>& argv, std::optional<uint64_t> joinAfter) {
  int code = 0;
  {
    const comm::Runtime runtime(config.transport);
    const auto timeout = std::chrono::milliseconds(static_cast<int64_t>(config.timeoutSeconds * 1000));
    // Ranks may leave or join a job that logs its SV batches while it runs (engine/membership/live.h).
    std::unique_ptr<comm::LiveGroup> live;
    std::unique_ptr<comm::Transport> owned;
    if (joinAfter) {
      auto joined = comm::joinLiveGroup(config.transport, argv, timeout);
      owned = std::move(joined.transport);
      live = std::move(joined.live);
    } else {
      owned = comm::makeTransport(config.transport);
      if (config.ckptSv) live = comm::makeLiveGroup(config.transport, argv);
    }
    comm::Transport& transport = *owned;
    orpheus::setupLogging(transport.rank(), config.logLevel);
    installTerminationReport(transport.rank(), config.timeoutSeconds);
    orpheus::setBlasThreads(config.blasThreads);
    try {
      code = joinAfter ? joinTrain(config, transport, *live, *joinAfter)
                       : runTrain(config, transport, live.get());
    } catch (const JobFailed& e) {
      code = e.code();
    } catch (const std::exception& e) {
      reportError(e.what());
      code = exitCodeFor(e);
    }
  }
  if (code != 0) {
    // A failed job can leave an HDF5 file open whose write failed (a full disk), and
    // the library's exit-time cleanup retries it and may crash. Nothing is left to
    // save: leave without that cleanup.
    spdlog::default_logger()->flush();
    std::fflush(nullptr);
    std::_Exit(code);
  }
  return code;
}

}  // namespace orpheus::engine::cli
