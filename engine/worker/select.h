// SV selection (the paper's section 3.2.1 and Algorithm 2): a worker sends C of the
// B SVGs of its batch instead of all of them, chosen jointly across all parameter
// matrices so that one SVG index selects the same example everywhere.
//
// Joint matrix column subset selection (JMCSS). Every parameter matrix site of the
// batch contributes two matrices X^(p) to the selection: its U (J x B) and its V
// (K x B). Each step samples an index i with probability proportional to
//     prod_p || column i of the residual X^(p)_t ||^2
// and then projects every residual off column i. One orthonormal basis per matrix
// is kept up to date by Gram-Schmidt with reorthogonalization, and the residual
// norms are updated from the new basis vector alone, so a step costs one pass over
// each X^(p), never a pseudo-inverse.
//
// Two refinements make the product usable on real models, documented here because
// they are not in the paper's pseudo-code:
//  - A column whose residual is below 1e-10 of its own squared norm counts as lying
//    in the span already (float rounding leaves residuals of about 1e-14 there).
//  - A matrix whose columns all lie in the span of the selected ones has no residual
//    left, and its factor would be zero for every column: selection would end at
//    the rank of the smallest matrix (the U of a softmax layer with 10 classes has
//    rank 9, so selection would never pass 9 SVGs). Such a matrix contributes the
//    squared norms of its columns instead: how much of the update each SVG still
//    carries there (a softmax u near zero carries little, whatever its v). Without
//    that weight, picks past the rank follow V alone, and the MLR error at C = 50
//    more than doubles. If no column has a non-zero product while some matrix still has a
//    residual, the step samples by the sum of those matrices' relative residuals.
// Selection stops early, with fewer than C SVGs, once every matrix's columns lie in
// the span of the selected ones: then the selected SVGs reproduce the batch exactly.
//
// The same draw from the Gram matrices (kJmcssGram). Everything Algorithm 2 needs of
// a matrix X is an inner product of its columns: the coordinates Q^T X of a new
// basis vector q = r_i / ||r_i|| are (G_i - W^T W_i) / ||r_i||, with G = X^T X and W
// the coordinates so far, and ||r_i||^2 = G_ii - ||W_i||^2 (a pivoted Cholesky
// factorization of G, pivots drawn as above). So the costly part of a selection is
// one product X^T X per matrix (2 J B^2 flops, one GEMM), which runs on the job's
// backend, where a resident pass left U and V; the draw, the cores and the
// coordinates then cost O(C B^2) per matrix on the host, whatever J. G is formed in
// float, so a residual is known to about 1e-7 of its column's squared norm: a column
// counts as in the span below 1e-5 of it (kJmcss: 1e-10), and the two methods draw
// alike but not bit for bit alike.
//
// Sending the selected columns alone, rescaled by B/C, approximates the update
// badly (worse than sending nothing on MLR). The selected batch therefore carries,
// per matrix, the C x C least-squares core
//     A = S_U^+ (U diag(c) V^T) (S_V^+)^T,
// so that S_U A S_V^T is the orthogonal projection P_U (U diag(c) V^T) P_V of the
// full update onto the spans of the selected columns: the closest update those
// columns can express. The bias update U c is likewise projected: S_U biasCoeffs =
// P_U U c. Both are computed from the Gram-Schmidt coordinates Q^T X (C x B), never
// from a J x K matrix.
#pragma once

#include "engine/base/rng.h"
#include "engine/base/sv_batch.h"
#include "ops/backend.h"
#include "ops/rebuild.h"

#include <cstdint>
#include <optional>
#include <span>
#include <string>
#include <vector>

namespace orpheus::engine {

// The numbers are the SV log's (ckpt/log_entry.h: a batch reference's method).
enum class SelectionMethod : uint32_t {
  kJmcss = 0,      // Algorithm 2 with least-squares cores
  kUniform = 1,    // C distinct SVGs uniformly at random, coefficients scaled by B/C (the paper's baseline)
  kJmcssGram = 2,  // Algorithm 2 and its cores from the Gram matrices X^T X, formed on the job's backend
};

std::string toString(SelectionMethod method);
// Parses "jmcss", "jmcss-gram" or "uniform"; throws InputError naming the choices otherwise.
SelectionMethod parseSelectionMethod(const std::string& name);
// The method a log's batch reference names; throws InputError for a number no method has.
SelectionMethod selectionMethodFromLog(uint32_t number);

// Where kJmcssGram forms its Gram matrices, kept by a caller that selects every
// clock so the products' operands and results are allocated once: `backend` (the
// job's), the batch's U and dense V's where a resident pass left them
// (`onDevice`, as Model::lastDeviceSvs; a matrix not named there is copied in
// from the host batch), and the device buffers reused clock after clock.
struct GramSource {
  ops::Backend* backend = nullptr;
  std::span<const ops::DeviceSvs> onDevice;
  ops::Tensor* operand = nullptr;  // a host matrix copied in (not used on the CPU backend)
  ops::Tensor* grams = nullptr;    // every product of a batch, side by side
};

// X^T X (n x n, float) of every matrix of `full`, in the order U_0, V_0, U_1, V_1,
// ...: each dense one by one product on the source's backend (all of them queued
// before the one copy of the results to the host), a sparse V's on the host.
// The same operations on the cpu and the strict backend, so the same bits.
std::vector<Matrix> svGrams(const SvBatch& full, const GramSource& source);

struct SelectionStats {
  double seconds = 0.0;          // wall time of the selection, cores included
  int64_t requested = 0;         // C
  int64_t selected = 0;          // SVGs in the result: min(C, B), or fewer when JMCSS stopped early
  std::vector<int64_t> indices;  // the columns of the full batch kept, in the order of the result
};

// Chooses c of the n SVGs of `full` (the same indices for every matrix) and returns
// them as a batch with `full`'s header.
//  - kJmcss: the columns in the order they were drawn; every matrix carries its
//    least-squares core (and, with a bias, its bias coefficients), so the batch's
//    per-column coefficients are unused and set to one. `full` may carry cores of
//    its own: the fit is then against U core V^T.
//  - kUniform: no core; coefficients are full.coeffs[i] * n / c. `full` must not
//    carry cores.
// With c >= n the result is `full` unchanged (no core, bit for bit), so selection
// switched off and C = B take the same path. c must be at least 1. Every random
// choice comes from `rng`: the same stream gives the same selection.
// kJmcss keeps scratch memory per calling thread between calls (8 bytes times the
// rows of all U and V together, times B + C), since a worker selects from batches of
// the same shapes every clock; its cost is one pass over every U and V per drawn SVG.
// kJmcssGram takes the batch's Gram matrices (svGrams) in `grams`; the other methods
// ignore them.
SvBatch selectSvgs(const SvBatch& full, int64_t c, SelectionMethod method, CounterRng& rng,
                   SelectionStats* stats = nullptr, std::span<const Matrix> grams = {});

// What rank `rank` sends of its local batch at `clock`: selectSvgs seeded by (job
// seed, kSelect, clock, rank), or none when selection is off (select <= 0 or >= the
// batch's columns: the whole batch goes). A pure function of its arguments, so a
// replay can recompute what a replica received from the sender's logged batch.
// kJmcssGram forms its Gram matrices from `source` (a replay: the restoring job's
// backend, which gives the live job's bits on the same kind of device).
std::optional<SvBatch> selectForPeers(const SvBatch& local, int64_t select, SelectionMethod method, uint64_t seed,
                                      uint64_t clock, int rank, const GramSource& source = {});

// --adapt's measure of what a smaller selection keeps (engine/adapt/policy.h, rule
// goodput): for each c of `counts`, the relative error ||rebuilt_c - full||_F /
// ||full||_F of the update, every matrix and bias together, where rebuilt_c is what
// selectForPeers(local, c, kJmcss, seed, clock, rank) would send: 1 for c = 0, 0 for
// c >= B. JMCSS is nested (the first c picks of a selection of C are the selection of
// c), so one draw of the largest c gives them all, from the Gram-Schmidt coordinates
// Q^T X it keeps: ||P_U dW P_V||^2 = ||Q_U^T U D V^T Q_V||^2 over the leading basis
// vectors of each prefix, ||dW||^2 from the B x B Gram matrices U^T U and V^T V, never
// a J x K matrix. Under kJmcssGram it measures this draw too, computed directly on
// the host: a draw from the same distribution as the one sent, not the same bits.
// The draw has a random stream of its own, keyed like selectForPeers's
// (counter-based: no other stream moves), and `local` is only read, so a job
// selects, sends and logs the same with and without the measurement.
std::vector<double> selectionErrors(const SvBatch& local, std::span<const int64_t> counts, uint64_t seed,
                                    uint64_t clock, int rank);

// The columns `columns` (distinct, in range) of `full` with the least-squares cores
// described above, whatever the columns: what kJmcss returns for the columns it
// drew. Columns that add no direction to a matrix still appear in the result.
SvBatch projectOntoColumns(const SvBatch& full, std::span<const int64_t> columns);

}  // namespace orpheus::engine
