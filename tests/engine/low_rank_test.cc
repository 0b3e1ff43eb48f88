// --sv-rank (engine/worker/low_rank.h): the sent update has rank R and the bias
// travels exactly; error feedback loses nothing (what was sent plus what is carried
// equals what the batches carried, every clock); a batch of rank <= R goes whole;
// the warm-started power iteration finds the best rank-R approximation of an update
// that recurs; on the strict device it gives the CPU backend's bits, with U and V
// copied in or read where a device pass left them; one-hot (sparse) V columns are
// compressed as the same columns dense.
#include "engine/worker/low_rank.h"

#include "ops/cpu/cpu_backend.h"
#include "ops/strict/strict_backend.h"

#include <catch2/catch.hpp>

#include <random>

using namespace orpheus;
using engine::LowRankSender;

namespace {

using MatD = Eigen::MatrixXd;

// The host's backend, on which these cases run the power iteration.
ops::Backend& host() {
  static ops::cpu::CpuBackend backend;
  return backend;
}

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

// What the clocks sent plus what the sender carries, against what the batches carried.
double conservationError(const LowRankSender& sender, const MatD& sent, const MatD& carried, size_t p) {
  return rel(sent + sender.carried(p).cast<double>(), carried);
}

TEST_CASE("--sv-rank sends rank R, the bias exactly, and carries the rest", "[low-rank]") {
  std::mt19937 gen(3);
  const SvBatch batch = randomBatch(10, gen);
  LowRankSender sender(host(), 3, 1);
  const SvBatch sent = sender.compress(batch);
  REQUIRE(sent.matrices.size() == 2);
  CHECK(sent.numColumns() == 4);
  for (size_t p = 0; p < 2; ++p) {
    CHECK(sent.matrices[p].u.cols() == 4);
    CHECK(sent.matrices[p].core.rows() == 4);
    const Eigen::JacobiSVD<MatD> svd(update(sent, p));
    CHECK(svd.singularValues()(3) < 1e-6 * svd.singularValues()(0));  // rank 3
    CHECK(conservationError(sender, update(sent, p), update(batch, p), p) < 1e-6);
  }
  CHECK(sent.matrices[0].biasId == 1);
  CHECK((biasUpdate(sent, 0) - biasUpdate(batch, 0)).norm() < 1e-5 * biasUpdate(batch, 0).norm());
  CHECK(sender.lastError() > 0.0);
  CHECK(sender.lastError() < 1.0);
}

TEST_CASE("--sv-rank of a batch of rank <= R is exact", "[low-rank]") {
  std::mt19937 gen(5);
  const SvBatch batch = randomBatch(2, gen);
  LowRankSender sender(host(), 2, 1);
  const SvBatch sent = sender.compress(batch);
  for (size_t p = 0; p < 2; ++p) CHECK(rel(update(sent, p), update(batch, p)) < 1e-5);
  CHECK(sender.lastError() < 1e-5);
}

TEST_CASE("--sv-rank's error feedback conserves the update, clock after clock", "[low-rank]") {
  std::mt19937 gen(7);
  LowRankSender sender(host(), 2, 1);
  MatD carried[2] = {MatD::Zero(12, 9), MatD::Zero(7, 12)};
  MatD delivered[2] = {MatD::Zero(12, 9), MatD::Zero(7, 12)};
  for (int clock = 0; clock < 6; ++clock) {
    const SvBatch batch = randomBatch(5, gen);
    const SvBatch sent = sender.compress(batch);
    for (size_t p = 0; p < 2; ++p) {
      carried[p] += update(batch, p);
      delivered[p] += update(sent, p);
      CHECK(conservationError(sender, delivered[p], carried[p], p) < 1e-5);
    }
  }
  CHECK(rel(delivered[0], carried[0]) > 0.05);  // not all of it has gone yet
  // Empty clocks (zero coefficients) drain what is carried, R directions a clock.
  for (int clock = 0; clock < 12; ++clock) {
    SvBatch none = randomBatch(5, gen);
    none.coeffs.setZero();
    const SvBatch sent = sender.compress(none);
    for (size_t p = 0; p < 2; ++p) delivered[p] += update(sent, p);
  }
  for (size_t p = 0; p < 2; ++p) CHECK(rel(delivered[p], carried[p]) < 1e-4);
}

TEST_CASE("--sv-rank sends M projected on R directions of its range", "[low-rank]") {
  std::mt19937 gen(13);
  LowRankSender sender(host(), 2, 1);
  for (int clock = 0; clock < 3; ++clock) {
    const MatD before = sender.carried(0).size() > 0 ? MatD(sender.carried(0).cast<double>()) : MatD::Zero(12, 9);
    const SvBatch batch = randomBatch(6, gen);
    const SvBatch sent = sender.compress(batch);
    const MatD m = before + update(batch, 0);
    const MatD s = update(sent, 0);
    // sent = P P^T M with P orthonormal: M - sent is orthogonal to sent, and no more
    // is sent than M holds.
    CHECK(std::abs((m - s).cwiseProduct(s).sum()) < 1e-5 * m.squaredNorm());
    CHECK(s.norm() <= m.norm() * (1 + 1e-6));
    const Eigen::JacobiSVD<MatD> svd(m);
    const double best = svd.singularValues().tail(svd.singularValues().size() - 2).norm();
    CHECK((m - s).norm() >= best * (1 - 1e-5));  // Eckart-Young: no rank-2 form does better
  }
}

TEST_CASE("--sv-rank compresses least-squares cores as well", "[low-rank]") {
  std::mt19937 gen(9);
  SvBatch batch = randomBatch(6, gen);
  for (SvMatrix& m : batch.matrices) {
    m.core = randomMatrix(6, 6, gen);
    if (m.biasId >= 0) m.biasCoeffs = randomMatrix(6, 1, gen);
  }
  LowRankSender sender(host(), 6, 1);
  const SvBatch sent = sender.compress(batch);  // rank 6 of a rank-6 update: exact
  for (size_t p = 0; p < 2; ++p) CHECK(rel(update(sent, p), update(batch, p)) < 1e-5);
  CHECK((biasUpdate(sent, 0) - biasUpdate(batch, 0)).norm() < 1e-5 * biasUpdate(batch, 0).norm());
}

TEST_CASE("--sv-rank of an all-zero update sends zeros and carries nothing", "[low-rank]") {
  std::mt19937 gen(11);
  SvBatch batch = randomBatch(4, gen);
  batch.matrices[1].u.setZero();  // e.g. a layer whose units are all inactive
  LowRankSender sender(host(), 2, 1);
  const SvBatch sent = sender.compress(batch);
  CHECK(update(sent, 1).norm() == 0.0);
  CHECK(sender.carried(1).norm() == 0.0f);
  CHECK(rel(update(sent, 0), update(batch, 0)) < 1.0);
}

TEST_CASE("--sv-rank with bf16 SVs sends bf16 values and carries their rounding error", "[low-rank][bf16]") {
  std::mt19937 gen(5);
  LowRankSender sender(host(), 2, 1, SvDtype::kBf16);
  MatD sent0 = MatD::Zero(12, 9), whole0 = MatD::Zero(12, 9);
  Eigen::VectorXd sentBias = Eigen::VectorXd::Zero(12), wholeBias = Eigen::VectorXd::Zero(12);
  for (int clock = 0; clock < 6; ++clock) {
    const SvBatch batch = randomBatch(8, gen);
    const SvBatch sent = sender.compress(batch);
    CHECK(sent.dtype == SvDtype::kBf16);
    for (const SvMatrix& m : sent.matrices) {
      for (Eigen::Index i = 0; i < m.u.size(); ++i) CHECK(m.u.data()[i] == roundToBf16(m.u.data()[i]));
      for (Eigen::Index i = 0; i < m.vDense.size(); ++i) CHECK(m.vDense.data()[i] == roundToBf16(m.vDense.data()[i]));
    }
    sent0 += update(sent, 0);
    whole0 += update(batch, 0);
    sentBias += biasUpdate(sent, 0);
    wholeBias += biasUpdate(batch, 0);
    // Sent plus carried is every clock's update, rounding error included.
    CHECK(conservationError(sender, sent0, whole0, 0) < 1e-5);
    CHECK((sentBias + sender.carriedBias(0).cast<double>() - wholeBias).norm() < 1e-5 * wholeBias.norm());
  }
  // The bias's rounding error is carried, not lost: it is bf16-sized, not zero.
  CHECK(sender.carriedBias(0).norm() > 0.0f);
  CHECK(sender.carriedBias(0).cwiseAbs().maxCoeff() < 0.05f * static_cast<float>(wholeBias.cwiseAbs().maxCoeff()));
}

TEST_CASE("--sv-rank's rank may move between clocks; errorsAt measures e(k) from the same iteration",
          "[low-rank][adapt]") {
  std::mt19937 gen(17);
  LowRankSender sender(host(), 4, 1);
  MatD carried[2] = {MatD::Zero(12, 9), MatD::Zero(7, 12)};
  MatD delivered[2] = {MatD::Zero(12, 9), MatD::Zero(7, 12)};
  const int64_t ranks[] = {4, 2, 1, 3, 4};
  for (const int64_t r : ranks) {
    sender.setRank(r);
    const SvBatch batch = randomBatch(8, gen);
    const SvBatch sent = sender.compress(batch);
    CHECK(sent.numColumns() == r + 1);
    for (size_t p = 0; p < 2; ++p) {
      carried[p] += update(batch, p);
      delivered[p] += update(sent, p);
      CHECK(conservationError(sender, delivered[p], carried[p], p) < 1e-5);  // nothing lost across the moves
    }
    // e(r) is lastError(); fewer columns leave more behind; none sent leaves all.
    const int64_t at[] = {0, 1, r};
    const std::vector<double> e = sender.errorsAt(at);
    CHECK(e[0] == Approx(1.0));
    CHECK(e[2] == Approx(sender.lastError()).margin(1e-6));
    CHECK(e[1] >= e[2] - 1e-9);
    CHECK(e[1] <= 1.0);
  }
  // The same sequence of ranks from the same seed gives the same batches, bitwise.
  LowRankSender twin(host(), 4, 1), other(host(), 4, 1);
  std::mt19937 gen2(17);
  for (const int64_t r : ranks) {
    twin.setRank(r);
    other.setRank(r);
    const SvBatch batch = randomBatch(8, gen2);
    const SvBatch a = twin.compress(batch), b = other.compress(batch);
    for (size_t p = 0; p < 2; ++p) CHECK(a.matrices[p].u == b.matrices[p].u);
  }
}

TEST_CASE("--sv-rank's errorsAt keeps the best k directions of span(P)", "[low-rank][adapt]") {
  // An update of three orthogonal directions of weights 3, 2 and 1: at rank 3 all is
  // sent, and e(1), e(2) are what the best one and two directions leave.
  SvBatch batch;
  batch.coeffs = Vector(3);
  batch.coeffs << 3.0f, 2.0f, 1.0f;
  SvMatrix m;
  m.paramId = 0;
  m.u = Matrix::Identity(5, 3);
  m.vDense = Matrix::Identity(4, 3);
  batch.matrices = {m};
  LowRankSender sender(host(), 3, 1);
  sender.compress(batch);
  const int64_t at[] = {1, 2, 3};
  const std::vector<double> e = sender.errorsAt(at);
  CHECK(e[0] == Approx(std::sqrt(5.0 / 14.0)).epsilon(1e-5));
  CHECK(e[1] == Approx(std::sqrt(1.0 / 14.0)).epsilon(1e-5));
  CHECK(e[2] == Approx(0.0).margin(1e-5));
}

TEST_CASE("--sv-rank on the strict device gives the CPU's bits, its U and V copied in or read on the device",
          "[low-rank][strict]") {
  const auto strict = ops::strict::makeStrictBackend();
  std::mt19937 gen(23);
  for (const SvDtype dtype : {SvDtype::kF32, SvDtype::kBf16}) {
    LowRankSender cpu(host(), 2, 1, dtype), copied(*strict, 2, 1, dtype), resident(*strict, 2, 1, dtype);
    const int64_t ranks[] = {2, 3, 1};
    for (int clock = 0; clock < 6; ++clock) {
      SvBatch batch = randomBatch(6, gen);
      if (clock % 3 == 1) batch.coeffs.setConstant(0.25f);  // one coefficient: the scaled copy
      if (clock % 3 == 2) {                                   // least-squares cores
        for (SvMatrix& m : batch.matrices) {
          m.core = randomMatrix(6, 6, gen);
          if (m.biasId >= 0) m.biasCoeffs = randomMatrix(6, 1, gen);
        }
      }
      const int64_t r = ranks[clock % 3];
      for (LowRankSender* s : {&cpu, &copied, &resident}) s->setRank(r);
      // The batch's U and V on the strict device, as a resident pass leaves them.
      std::vector<ops::Tensor> tensors;
      std::vector<ops::DeviceSvs> svs;
      for (const SvMatrix& m : batch.matrices) {
        for (const Matrix* h : {&m.u, &m.vDense}) {
          tensors.push_back(strict->allocate(h->rows(), h->cols()));
          strict->copy(ops::Tensor::host(h->data(), h->rows(), h->cols()), tensors.back());
        }
      }
      for (size_t i = 0; i < batch.matrices.size(); ++i) svs.push_back({nullptr, &tensors[2 * i], &tensors[2 * i + 1]});
      const SvBatch a = cpu.compress(batch), b = copied.compress(batch), c = resident.compress(batch, svs);
      for (size_t p = 0; p < 2; ++p) {
        for (const SvBatch* other : {&b, &c}) {
          CHECK(other->matrices[p].u == a.matrices[p].u);
          CHECK(other->matrices[p].vDense == a.matrices[p].vDense);
        }
        CHECK(copied.carried(p) == cpu.carried(p));
        CHECK(resident.carried(p) == cpu.carried(p));
      }
      CHECK(copied.lastError() == cpu.lastError());
      CHECK(resident.lastError() == cpu.lastError());
    }
    // The carried state leaves the device for the checkpoint and comes back: the
    // restored sender goes on as the one it came from.
    const std::string prefix = "sv-rank:";
    LowRankSender back(*strict, 1, 9, dtype);
    back.restore(resident.state(prefix), prefix);
    const SvBatch batch = randomBatch(6, gen);
    const SvBatch x = resident.compress(batch), y = back.compress(batch);
    for (size_t p = 0; p < 2; ++p) CHECK(x.matrices[p].u == y.matrices[p].u);
  }
}

TEST_CASE("--sv-rank of one-hot token columns (a sparse V) sends what the same columns dense send",
          "[low-rank][strict]") {
  // A sparse V's products are sparse ones (E + A V^T, then - P Q'^T: another order of
  // the same sums), so sparse and dense agree to rounding; the strict device runs the
  // sparse path's operations in its order and gives its bits.
  const auto strict = ops::strict::makeStrictBackend();
  std::mt19937 gen(31);
  std::uniform_int_distribution<int> token(0, 8);
  LowRankSender sparse(host(), 2, 1), dense(host(), 2, 1), device(*strict, 2, 1);
  MatD carried = MatD::Zero(12, 9), sent = MatD::Zero(12, 9);
  for (int clock = 0; clock < 4; ++clock) {
    SvBatch batch = randomBatch(6, gen);
    SvMatrix& e = batch.matrices[0];  // an embedding: V's columns one-hot, 9 words
    std::vector<Eigen::Triplet<float, int32_t>> ones;
    for (int c = 0; c < 6; ++c) ones.emplace_back(token(gen), c, 1.0f);
    e.vSparse.resize(9, 6);
    e.vSparse.setFromTriplets(ones.begin(), ones.end());
    if (clock % 2 == 1) e.vSparse.makeCompressed();  // taken either way
    SvBatch asDense = batch;
    asDense.matrices[0].vDense = e.vSparse.toDense();
    e.sparseV = true;
    e.vDense.resize(0, 0);
    const SvBatch a = sparse.compress(batch), b = dense.compress(asDense), c = device.compress(batch);
    for (size_t p = 0; p < 2; ++p) {
      CHECK(rel(update(a, p), update(b, p)) < 1e-5);
      CHECK(rel(sparse.carried(p).cast<double>(), dense.carried(p).cast<double>()) < 1e-5);
      CHECK(c.matrices[p].u == a.matrices[p].u);
      CHECK(c.matrices[p].vDense == a.matrices[p].vDense);
      CHECK(device.carried(p) == sparse.carried(p));
    }
    CHECK(!a.matrices[0].sparseV);
    // Nothing lost: what was sent and what is carried is what the batches carried.
    carried += update(asDense, 0);
    sent += update(a, 0);
    CHECK(conservationError(sparse, sent, carried, 0) < 1e-5);
  }
}

TEST_CASE("--sv-rank joins the sparse V of a recurrent model's steps into one sparse matrix", "[low-rank][strict]") {
  // Three steps of an embedding (one-hot V) and of a dense matrix: the joined sparse
  // V gives what the same steps with V dense give, to rounding, and the strict device
  // the host's bits.
  const auto strict = ops::strict::makeStrictBackend();
  std::mt19937 gen(41);
  std::uniform_int_distribution<int> token(0, 8);
  LowRankSender sparse(host(), 2, 5), dense(host(), 2, 5), device(*strict, 2, 5);
  for (int clock = 0; clock < 3; ++clock) {
    SvBatch batch = randomBatch(4, gen);
    const SvMatrix embedding = batch.matrices[0], other = batch.matrices[1];
    batch.matrices.clear();
    for (int step = 0; step < 3; ++step) {
      SvMatrix e = embedding;
      e.u = randomMatrix(e.u.rows(), e.u.cols(), gen);
      std::vector<Eigen::Triplet<float, int32_t>> ones;
      for (int c = 0; c < 4; ++c) ones.emplace_back(token(gen), c, 1.0f);
      e.vSparse.resize(9, 4);
      e.vSparse.setFromTriplets(ones.begin(), ones.end());
      e.vSparse.makeCompressed();
      e.sparseV = true;
      e.vDense.resize(0, 0);
      batch.matrices.push_back(std::move(e));
      batch.matrices.push_back(other);
    }
    SvBatch asDense = batch;
    for (SvMatrix& m : asDense.matrices) {
      if (!m.sparseV) continue;
      m.vDense = m.vSparse.toDense();
      m.sparseV = false;
    }
    const SvBatch a = sparse.compress(batch), b = dense.compress(asDense), c = device.compress(batch);
    REQUIRE(a.matrices.size() == 2);
    for (size_t p = 0; p < 2; ++p) {
      CHECK(rel(update(a, p), update(b, p)) < 1e-5);
      CHECK(c.matrices[p].u == a.matrices[p].u);
      CHECK(c.matrices[p].vDense == a.matrices[p].vDense);
      CHECK(device.carried(p) == sparse.carried(p));
    }
  }
}

TEST_CASE("--sv-rank sends one matrix per parameter for the sites of a recurrent model's steps",
          "[low-rank][strict]") {
  const auto strict = ops::strict::makeStrictBackend();
  std::mt19937 gen(37);
  LowRankSender sender(host(), 2, 1), device(*strict, 2, 1), merged(host(), 2, 1);
  MatD carried = MatD::Zero(12, 9), sent = MatD::Zero(12, 9);
  for (int clock = 0; clock < 4; ++clock) {
    // Three steps: matrix 0 (with its bias) at each, matrix 2 at the last only.
    SvBatch steps = randomBatch(5, gen);
    const SvMatrix a = steps.matrices[0], c = steps.matrices[1];
    steps.matrices = {a, randomBatch(5, gen).matrices[0], randomBatch(5, gen).matrices[0], c};
    // The same update as one batch of 15 columns: U_t diag(c) side by side, coefficients one.
    SvBatch whole;
    whole.coeffs = Vector::Ones(15);
    SvMatrix m0 = a;
    m0.u.resize(12, 15);
    m0.vDense.resize(9, 15);
    for (int t = 0; t < 3; ++t) {
      m0.u.middleCols(5 * t, 5) = steps.matrices[t].u * steps.coeffs.asDiagonal();
      m0.vDense.middleCols(5 * t, 5) = steps.matrices[t].vDense;
    }
    whole.matrices = {m0};
    const SvBatch x = sender.compress(steps), y = device.compress(steps), z = merged.compress(whole);
    REQUIRE(x.matrices.size() == 2);  // one per parameter, in the order of their first site
    CHECK(x.matrices[0].paramId == 0);
    CHECK(x.matrices[1].paramId == 2);
    CHECK(x.matrices[0].u == z.matrices[0].u);
    CHECK(x.matrices[0].vDense == z.matrices[0].vDense);
    CHECK(y.matrices[0].u == x.matrices[0].u);
    CHECK(y.matrices[1].vDense == x.matrices[1].vDense);
    CHECK(sender.carried(0) == merged.carried(0));
    // What was sent plus what is carried is the three steps' update, and the bias goes whole.
    MatD all = MatD::Zero(12, 9);
    Eigen::VectorXd bias = Eigen::VectorXd::Zero(12);
    for (int t = 0; t < 3; ++t) {
      SvBatch one = steps;
      one.matrices = {steps.matrices[t]};
      all += update(one, 0);
      bias += biasUpdate(one, 0);
    }
    carried += all;
    sent += update(x, 0);
    CHECK(conservationError(sender, sent, carried, 0) < 1e-5);
    CHECK((biasUpdate(x, 0) - bias).norm() <= 1e-5 * bias.norm());
  }
  // The checkpoint's shapes: one per parameter the sites update.
  const std::pair<uint32_t, int32_t> sites[] = {{0, 1}, {2, -1}, {0, 1}, {2, -1}, {0, 1}};
  const std::pair<int64_t, int64_t> params[] = {{12, 9}, {12, 1}, {7, 12}};
  const auto shapes = LowRankSender::stateShapes(sites, params);
  REQUIRE(shapes.size() == 2);
  CHECK(shapes[0] == std::pair<int64_t, int64_t>{12, 9});
  CHECK(shapes[1] == std::pair<int64_t, int64_t>{7, 12});
}

TEST_CASE("--sv-rank on the strict device copies through its staging buffer: no copy blocks the host after the "
          "first clock",
          "[low-rank][strict]") {
  const auto strict = ops::strict::makeStrictBackend();
  std::mt19937 gen(24);
  for (const SvDtype dtype : {SvDtype::kF32, SvDtype::kBf16}) {
    LowRankSender sender(*strict, 2, 1, dtype);
    for (int clock = 0; clock < 3; ++clock) {
      SvBatch batch = randomBatch(6, gen);
      if (clock == 2) {
        for (SvMatrix& m : batch.matrices) {
          m.core = randomMatrix(6, 6, gen);
          if (m.biasId >= 0) m.biasCoeffs = randomMatrix(6, 1, gen);
        }
      }
      const uint64_t before = strict->transfers().blocking;
      const SvBatch out = sender.compress(batch);
      INFO("clock " << clock);
      // The first clock uploads E's zeros and Q's draw once; after it, U, V, the
      // core, -P and the bias coefficients go up and M Q, Q', the norms and the
      // bias update come down asynchronously (it was 16 copies, each a wait).
      if (clock > 0) CHECK(strict->transfers().blocking - before == 0);
      CHECK(out.matrices.size() == batch.matrices.size());
    }
  }
}
