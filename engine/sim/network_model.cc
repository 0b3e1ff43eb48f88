#include "engine/sim/network_model.h"

#include "engine/base/error.h"

#include <algorithm>
#include <cmath>
#include <numeric>

namespace orpheus::engine::sim {
namespace {

double bytesPerSecond(double gbps) { return gbps * 1e9 / 8.0; }

}  // namespace

double NetworkModel::sendBytesPerSecond() const {
  return bytesPerSecond(nicGbps > 0.0 ? std::min(linkGbps, nicGbps) : linkGbps);
}

double NetworkModel::receiveBytesPerSecond() const { return sendBytesPerSecond(); }

double NetworkModel::stackSeconds(double bytes) const {
  return stackGbps > 0.0 ? bytes / bytesPerSecond(stackGbps) : 0.0;
}

void NetworkModel::validate() const {
  // Below a kbit/s a clock's time would overflow the virtual clock, not model a network.
  constexpr double kMinGbps = 1e-6;
  ORPHEUS_CHECK_INPUT(linkGbps >= kMinGbps, "--sim-link-gbps {} must be at least {} (1 kbit/s)", linkGbps, kMinGbps);
  const auto rate = [&](const char* flag, double gbps, const char* zero) {
    ORPHEUS_CHECK_INPUT(gbps == 0.0 || gbps >= kMinGbps, "--sim-{}-gbps {} must be 0 ({}) or at least {} (1 kbit/s)",
                        flag, gbps, zero, kMinGbps);
  };
  rate("nic", nicGbps, "the link's");
  rate("core", coreGbps, "full bisection");
  rate("stack", stackGbps, "free");
  ORPHEUS_CHECK_INPUT(latencySeconds >= 0.0, "--sim-latency-us {} must not be negative", latencySeconds * 1e6);
}

Network::Network(const NetworkModel& model, int ranks)
    : model_(model), sendFree_(static_cast<size_t>(ranks), 0.0), receiveFree_(static_cast<size_t>(ranks), 0.0) {}

std::vector<std::vector<double>> Network::deliver(std::span<const Transfer> transfers) {
  struct Copy {
    size_t transfer;
    size_t slot;
    double reaches;
  };
  double sendRate = model_.sendBytesPerSecond();
  if (model_.coreGbps > 0.0) {
    std::vector<int> senders;
    for (const Transfer& t : transfers)
      if (!t.receivers.empty()) senders.push_back(t.sender);
    std::sort(senders.begin(), senders.end());
    const auto distinct = std::unique(senders.begin(), senders.end()) - senders.begin();
    if (distinct > 0) sendRate = std::min(sendRate, bytesPerSecond(model_.coreGbps) / static_cast<double>(distinct));
  }
  const double receiveRate = model_.receiveBytesPerSecond();

  // The senders' side: copies leave back to back.
  std::vector<std::vector<double>> in(transfers.size());
  std::vector<std::vector<Copy>> byReceiver(receiveFree_.size());
  for (size_t i = 0; i < transfers.size(); ++i) {
    const Transfer& t = transfers[i];
    in[i].assign(t.receivers.size(), 0.0);
    double& free = sendFree_[static_cast<size_t>(t.sender)];
    const double copyTime = static_cast<double>(t.bytes) / sendRate;
    double leaves = std::max(free, t.ready);
    for (size_t k = 0; k < t.receivers.size(); ++k) {
      if (k == 0 || !model_.multicast) leaves += copyTime;
      byReceiver[static_cast<size_t>(t.receivers[k])].push_back({i, k, leaves + model_.latencySeconds});
    }
    if (!t.receivers.empty()) free = leaves;
  }
  // The receivers' side: copies come in one at a time, in the order they reach it.
  for (size_t r = 0; r < byReceiver.size(); ++r) {
    auto& copies = byReceiver[r];
    std::stable_sort(copies.begin(), copies.end(), [](const Copy& a, const Copy& b) { return a.reaches < b.reaches; });
    double& free = receiveFree_[r];
    for (const Copy& c : copies) {
      const double takes = static_cast<double>(transfers[c.transfer].bytes) / receiveRate;
      free = std::max(c.reaches, free + takes);
      in[c.transfer][c.slot] = free;
    }
  }
  return in;
}

double ringAllreduceSeconds(const NetworkModel& model, int ranks, double bytes) {
  if (ranks <= 1) return 0.0;
  const double p = ranks;
  double rate = model.sendBytesPerSecond();
  if (model.coreGbps > 0.0) rate = std::min(rate, model.coreGbps * 1e9 / 8.0 / p);
  return 2.0 * (p - 1.0) * (model.latencySeconds + bytes / p / rate);
}

double treeAllreduceSeconds(const NetworkModel& model, int ranks, double bytes) {
  if (ranks <= 1) return 0.0;
  double rate = model.sendBytesPerSecond();
  // At most half the ranks send in a step.
  if (model.coreGbps > 0.0) rate = std::min(rate, model.coreGbps * 1e9 / 8.0 / std::max(1, ranks / 2));
  const double steps = 2.0 * std::ceil(std::log2(static_cast<double>(ranks)));
  return steps * (model.latencySeconds + bytes / rate);
}

double allreduceSeconds(const NetworkModel& model, int ranks, double bytes) {
  return model.allreduce == AllreduceAlgorithm::kTree ? treeAllreduceSeconds(model, ranks, bytes)
                                                      : ringAllreduceSeconds(model, ranks, bytes);
}

double ringShiftSeconds(const NetworkModel& model, int ranks, double bytes) {
  if (ranks <= 1) return 0.0;
  double rate = model.sendBytesPerSecond();
  if (model.coreGbps > 0.0) rate = std::min(rate, model.coreGbps * 1e9 / 8.0 / ranks);
  return model.latencySeconds + bytes / rate;
}

}  // namespace orpheus::engine::sim
