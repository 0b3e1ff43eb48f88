// --sv-rank (engine/worker/low_rank.h): the sent update is the best rank-R
// approximation of the batch's update plus the residual, the bias travels exactly,
// and with error feedback nothing is lost: what the clocks sent, once the residual
// has drained, sums to what their batches carried.
#include "engine/worker/low_rank.h"

#include <catch2/catch.hpp>

#include <random>

using namespace orpheus;
using engine::LowRankSender;

namespace {

using MatD = Eigen::MatrixXd;

Matrix randomMatrix(Eigen::Index rows, Eigen::Index cols, std::mt19937& gen) {
  std::normal_distribution<float> normal;
  Matrix m(rows, cols);
  for (Eigen::Index i = 0; i < m.size(); ++i) m(i) = normal(gen);
  return m;
}

// A batch of n columns over a 12 x 9 matrix with a bias and a 7 x 12 one without.
SvBatch randomBatch(Eigen::Index n, std::mt19937& gen) {
  SvBatch b;
  b.coeffs = randomMatrix(n, 1, gen);
  SvMatrix a;
  a.paramId = 0;
  a.biasId = 1;
  a.u = randomMatrix(12, n, gen);
  a.vDense = randomMatrix(9, n, gen);
  SvMatrix c;
  c.paramId = 2;
  c.u = randomMatrix(7, n, gen);
  c.vDense = randomMatrix(12, n, gen);
  b.matrices = {a, c};
  return b;
}

// The update matrix p of a batch carries, and its bias update (empty without one).
MatD update(const SvBatch& b, size_t p) {
  const SvMatrix& m = b.matrices[p];
  const MatD core = m.core.size() > 0 ? MatD(m.core.cast<double>()) : MatD(b.coeffs.cast<double>().asDiagonal());
  return m.u.cast<double>() * core * m.vDense.cast<double>().transpose();
}
Eigen::VectorXd biasUpdate(const SvBatch& b, size_t p) {
  const SvMatrix& m = b.matrices[p];
  if (m.biasId < 0) return {};
  const Vector& c = m.core.size() > 0 ? m.biasCoeffs : b.coeffs;
  return m.u.cast<double>() * c.cast<double>();
}

double rel(const MatD& a, const MatD& b) { return (a - b).norm() / b.norm(); }

}  // namespace

TEST_CASE("--sv-rank sends the best rank-R approximation and the bias exactly", "[low-rank]") {
  std::mt19937 gen(3);
  const SvBatch batch = randomBatch(10, gen);
  LowRankSender sender(3);
  const SvBatch sent = sender.compress(batch);
  REQUIRE(sent.matrices.size() == 2);
  CHECK(sent.numColumns() == 4);
  for (size_t p = 0; p < 2; ++p) {
    CHECK(sent.matrices[p].u.cols() == 4);
    CHECK(sent.matrices[p].core.rows() == 4);
    const MatD g = update(batch, p);
    const Eigen::JacobiSVD<MatD> svd(g, Eigen::ComputeThinU | Eigen::ComputeThinV);
    const MatD best = svd.matrixU().leftCols(3) * svd.singularValues().head(3).asDiagonal() *
                      svd.matrixV().leftCols(3).transpose();
    CHECK(rel(update(sent, p), best) < 1e-5);
  }
  CHECK(sent.matrices[0].biasId == 1);
  CHECK((biasUpdate(sent, 0) - biasUpdate(batch, 0)).norm() < 1e-5 * biasUpdate(batch, 0).norm());
  CHECK(sender.lastError() > 0.0);
  CHECK(sender.lastError() < 1.0);
}

TEST_CASE("--sv-rank of a batch of rank <= R is exact", "[low-rank]") {
  std::mt19937 gen(5);
  const SvBatch batch = randomBatch(2, gen);
  LowRankSender sender(2);
  const SvBatch sent = sender.compress(batch);
  for (size_t p = 0; p < 2; ++p) CHECK(rel(update(sent, p), update(batch, p)) < 1e-5);
  CHECK(sender.lastError() < 1e-6);
}

TEST_CASE("--sv-rank's error feedback loses nothing once the residual drains", "[low-rank]") {
  std::mt19937 gen(7);
  LowRankSender sender(2);
  MatD carried[2] = {MatD::Zero(12, 9), MatD::Zero(7, 12)};
  MatD delivered[2] = {MatD::Zero(12, 9), MatD::Zero(7, 12)};
  // 4 clocks of rank-5 batches leave at most 4 * 3 = 12 triplets behind (< kResidualRank).
  for (int clock = 0; clock < 4; ++clock) {
    const SvBatch batch = randomBatch(5, gen);
    const SvBatch sent = sender.compress(batch);
    for (size_t p = 0; p < 2; ++p) {
      carried[p] += update(batch, p);
      delivered[p] += update(sent, p);
    }
  }
  CHECK(rel(delivered[0], carried[0]) > 0.05);  // not all of it has gone yet
  // Empty clocks (zero coefficients) drain the residual, R triplets a clock.
  for (int clock = 0; clock < 8; ++clock) {
    SvBatch none = randomBatch(5, gen);
    none.coeffs.setZero();
    const SvBatch sent = sender.compress(none);
    for (size_t p = 0; p < 2; ++p) delivered[p] += update(sent, p);
  }
  for (size_t p = 0; p < 2; ++p) CHECK(rel(delivered[p], carried[p]) < 1e-4);
}

TEST_CASE("--sv-rank compresses a selected batch (least-squares cores) as well", "[low-rank]") {
  std::mt19937 gen(9);
  SvBatch batch = randomBatch(6, gen);
  for (SvMatrix& m : batch.matrices) {
    m.core = randomMatrix(6, 6, gen);
    if (m.biasId >= 0) m.biasCoeffs = randomMatrix(6, 1, gen);
  }
  LowRankSender sender(6);
  const SvBatch sent = sender.compress(batch);  // rank 6 of a rank-6 update: exact
  for (size_t p = 0; p < 2; ++p) CHECK(rel(update(sent, p), update(batch, p)) < 1e-5);
  CHECK((biasUpdate(sent, 0) - biasUpdate(batch, 0)).norm() < 1e-5 * biasUpdate(batch, 0).norm());
}

TEST_CASE("--sv-rank of an all-zero update sends zeros and keeps nothing", "[low-rank]") {
  std::mt19937 gen(11);
  SvBatch batch = randomBatch(4, gen);
  batch.matrices[1].u.setZero();  // e.g. a layer whose units are all inactive
  LowRankSender sender(2);
  const SvBatch sent = sender.compress(batch);
  CHECK(update(sent, 1).norm() == 0.0);
  CHECK(rel(update(sent, 0), update(batch, 0)) < 1.0);
}
