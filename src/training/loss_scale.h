// loss_scale.h: the dynamic loss scale of fp16 training. The loss (so every gradient) is multiplied
// by the scale before backward, so that small gradients survive fp16's narrow range; a step whose
// gradient is not finite (something overflowed) is skipped and the scale halved; after `interval`
// clean steps in a row the scale doubles. With fp32 or bf16 compute the scale stays 1 and nothing
// is skipped. Used by the training thread; the same on every rank (the overflow test is global).
#pragma once

namespace chorus::training {

class LossScale {
 public:
  // dynamic: fp16 (initial scale, growth interval); otherwise a fixed scale of 1.
  LossScale(bool dynamic, double initial, int interval)
      : dynamic_(dynamic), scale_(dynamic ? initial : 1.0), interval_(interval) {}
  bool dynamic() const { return dynamic_; }
  double scale() const { return scale_; }
  long skipped() const { return skipped_; }
  int cleanRun() const { return clean_; }
  // After a step whose gradient norm (unscaled) was gradNorm: returns whether the step counts
  // (false: it overflowed and was skipped), and moves the scale.
  bool update(double gradNorm);
  // A checkpoint's state back (scale, steps skipped so far, clean steps in the current run).
  void restore(double scale, long skipped, int clean);

 private:
  bool dynamic_;
  double scale_;
  int interval_;
  int clean_ = 0;
  long skipped_ = 0;
};

}  // namespace chorus::training
