// loss_scale.cc: the dynamic loss scale (loss_scale.h).
#include "src/training/loss_scale.h"

#include <algorithm>
#include <cmath>

namespace chorus::training {

bool LossScale::update(double gradNorm) {
  if (!std::isfinite(gradNorm)) {
    // Even with a scale of 1 an overflow skips the step: the parameters must not take it.
    ++skipped_;
    clean_ = 0;
    if (dynamic_) scale_ = std::max(1.0, scale_ / 2);
    return false;
  }
  if (dynamic_ && ++clean_ >= interval_) {
    scale_ *= 2;
    clean_ = 0;
  }
  return true;
}

void LossScale::restore(double scale, long skipped, int clean) {
  scale_ = scale;
  skipped_ = skipped;
  clean_ = clean;
}

}  // namespace chorus::training
