// moe.h: a mixture-of-experts layer's routing on host memory (GShard, Switch Transformer, ST-MoE):
// the router's softmax, the top-k choice of experts with their gates, a capacity per expert, the
// auxiliary load-balancing loss and the router z-loss, the gather of tokens into their experts'
// rows (dispatch) and the gated sum back (combine), forward and backward; and SwiGLU, the gated
// activation an expert's MLP may use. The experts' products are matmul.h's. Shapes as in nn.h:
// row-major, n tokens of C channels, E experts, k choices per token. Pure functions.
#pragma once

#include <cstddef>

namespace chorus::kernels {

// probs(n, E) = softmax of each row of logits(n, E); lse(n) = each row's log-sum-exp (for the z-loss).
void routerSoftmax(float* probs, float* lse, const float* logits, int n, int E);

// The top-k choice. expert(n, k): each token's k most probable experts, best first (equal
// probabilities: the lower expert first). gate(n, k): their probabilities, divided by the k's sum
// when normalize (Mixtral, GShard top-2), else as they are (Switch, k = 1). assigned(E): the
// choices each expert got. Each expert takes at most `capacity` rows (negative: no limit), in
// priority order: every token's first choice (tokens in order), then every second choice, ...
// (GShard). A choice past its expert's capacity is dropped: row -1, its token gets nothing from
// that expert (the residual carries it). counts(E): the rows each expert took; row(n, k): each
// kept choice's row in the dispatch buffer, whose experts' rows follow each other in expert order
// (expert e's from offsets[e] = counts[0] + ... + counts[e-1]), each expert's in priority order.
// Returns the choices dropped.
int routeTopK(int* expert, float* gate, int* row, int* assigned, int* counts, const float* probs, int n, int E, int k,
              bool normalize, int capacity);
// Rows an expert takes for n tokens of k choices at this capacity factor: ceil(factor n k / E)
// (GShard); a factor of 0 or less: no limit (-1).
int expertCapacity(double factor, int n, int E, int k);

// The router's losses, as means over `total` tokens that may lie on several ranks (the ranks add
// up their sums first): sums(E) = each expert's probabilities summed over this rank's tokens;
// the Switch load-balancing loss E / (total k) sum_e assigned_e * sums_e / total (assigned
// summed over the ranks too): 1 when the choices and the probabilities are spread evenly, up to
// E when one expert takes all; the z-loss (ST-MoE) is the mean of lse^2 (routerSquares gives
// this rank's sum).
void routerColumnSums(float* sums, const float* probs, int n, int E);
float routerAuxLoss(const float* sums, const int* assigned, int total, int E, int k);
double routerSquares(const float* lse, int n);

// dlogits(n, E), written: the gradient through the gates (dgate(n, k), the gradient of each
// choice's gate; dropped choices' are ignored), plus auxScale times the aux loss's and zScale times
// the z-loss's (auxScale = the aux coefficient times the loss's scale), both means over `total`
// tokens with the choices `assigned` to each expert over them. The counts are constants, as in
// Switch.
void routerBackward(float* dlogits, const float* dgate, const float* probs, const float* lse, const int* expert,
                    const float* gate, const int* row, const int* assigned, int n, int total, int E, int k,
                    bool normalize, float auxScale, float zScale);

// buffer(rows, C): each kept choice's token, buffer[row(i, j)] = x[i].
void moeDispatch(float* buffer, const float* x, const int* row, int n, int k, int C);
// dx(n, C) += for each kept choice, dbuffer[row(i, j)].
void moeDispatchBackward(float* dx, const float* dbuffer, const int* row, int n, int k, int C);
// out(n, C) = sum over the kept choices of gate(i, j) y[row(i, j)], written (zeros for a token
// whose every choice was dropped).
void moeCombine(float* out, const float* y, const int* row, const float* gate, int n, int k, int C);
// dy[row(i, j)] = gate(i, j) dout[i] (written; rows of no choice are left as they are) and
// dgate(i, j) = dout[i] . y[row(i, j)] (0 when dropped).
void moeCombineBackward(float* dy, float* dgate, const float* dout, const float* y, const int* row, const float* gate,
                        int n, int k, int C);

// SwiGLU (Shazeer 2020): inp(n, 2h) holds a and b side by side; out(n, h) = silu(a) * b, with
// silu(a) = a sigmoid(a). dinp(n, 2h) += the gradient.
void swigluForward(float* out, const float* inp, int n, int h);
void swigluBackward(float* dinp, const float* inp, const float* dout, int n, int h);

}  // namespace chorus::kernels
