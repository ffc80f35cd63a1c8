// gpt_reference.cc: writes a small GPT's run for tests/reference/gpt_torch.py to repeat in PyTorch:
// the parameters, a batch, the logits, the loss and every gradient of one forward and backward, then
// the losses of AdamW steps on further batches. Usage: gpt_reference OUT_DIR [steps]. Files:
// meta.json (configuration, tensor layout, optimiser settings, losses), params.f32, tokens.i32 and
// targets.i32 ((steps + 1) batches), logits.f32, grads.f32, after.f32 (parameters after the steps).
#include <fmt/format.h>

#include <algorithm>
#include <cstdio>
#include <exception>
#include <fstream>
#include <nlohmann/json.hpp>
#include <random>
#include <string>
#include <vector>

#include "kernels/cpu/nn.h"
#include "src/training/gpt.h"

namespace {

template <typename T>
void writeFile(const std::string& path, const std::vector<T>& data) {
  std::ofstream f(path, std::ios::binary);
  f.write(reinterpret_cast<const char*>(data.data()), static_cast<std::streamsize>(data.size() * sizeof(T)));
  if (!f) throw std::runtime_error("cannot write " + path);
}

}  // namespace

int main(int argc, char** argv) {
  using namespace chorus::training;
  if (argc < 2) {
    std::fprintf(stderr, "usage: gpt_reference OUT_DIR [steps]\n");
    return 2;
  }
  const std::string dir = argv[1];
  const int steps = argc > 2 ? std::stoi(argv[2]) : 10;
  try {
    GptConfig config;
    config.layers = 2;
    config.heads = 4;
    config.width = 32;
    config.context = 24;
    config.vocab = 67;
    const int B = 3, T = 16;
    Gpt model(config, B, T);
    const ParamLayout& layout = model.layout();
    std::vector<float> params(layout.total()), grads(layout.total(), 0.0f);
    layout.initialize(1234, params.data(), 0, params.size());
    // Every parameter moved off its initial value (biases off zero, norms off one), so that a term
    // forgotten in forward or backward shows in the comparison.
    std::mt19937 gen(99);
    std::normal_distribution<float> jitter(0.0f, 0.05f);
    for (auto& p : params) p += jitter(gen);

    std::uniform_int_distribution<int> token(0, config.vocab - 1);
    std::vector<int> tokens(static_cast<size_t>(steps + 1) * B * T), targets(tokens.size());
    for (auto& t : tokens) t = token(gen);
    for (auto& t : targets) t = token(gen);

    FlatAccess access(layout, params.data(), grads.data());
    const float loss = model.forward(tokens.data(), targets.data(), access);
    std::vector<float> logits(model.logits().begin(), model.logits().end());
    model.backward(access);
    writeFile(dir + "/params.f32", params);
    writeFile(dir + "/tokens.i32", tokens);
    writeFile(dir + "/targets.i32", targets);
    writeFile(dir + "/logits.f32", logits);
    writeFile(dir + "/grads.f32", grads);

    // AdamW steps, batch k + 1 at step k, decay on matrices and embeddings only.
    chorus::kernels::OptimizerSettings adam;
    adam.lr = 1e-2f;
    adam.beta1 = 0.9f;
    adam.beta2 = 0.95f;
    adam.eps = 1e-8f;
    adam.weightDecay = 0.1f;
    std::vector<float> m(layout.total(), 0.0f), v(layout.total(), 0.0f);
    std::vector<double> losses;
    for (int step = 1; step <= steps; ++step) {
      std::fill(grads.begin(), grads.end(), 0.0f);
      const size_t at = static_cast<size_t>(step) * B * T;
      losses.push_back(model.forward(tokens.data() + at, targets.data() + at, access));
      model.backward(access);
      for (const auto& t : layout.tensors()) {
        auto s = adam;
        if (!t.decay) s.weightDecay = 0.0f;
        chorus::kernels::adamwStep(params.data() + t.offset, grads.data() + t.offset, m.data() + t.offset,
                                   v.data() + t.offset, t.count, step, s);
      }
    }
    writeFile(dir + "/after.f32", params);

    nlohmann::json meta;
    meta["config"] = {{"layers", config.layers},
                      {"heads", config.heads},
                      {"width", config.width},
                      {"context", config.context},
                      {"vocab", config.vocab}};
    meta["batch"] = B;
    meta["seq"] = T;
    meta["loss"] = loss;
    meta["steps"] = steps;
    meta["step_losses"] = losses;
    meta["adamw"] = {{"lr", adam.lr},
                     {"beta1", adam.beta1},
                     {"beta2", adam.beta2},
                     {"eps", adam.eps},
                     {"weight_decay", adam.weightDecay}};
    for (const auto& t : layout.tensors()) {
      meta["tensors"].push_back({{"name", t.name}, {"shape", t.shape}, {"offset", t.offset}, {"decay", t.decay}});
    }
    std::ofstream(dir + "/meta.json") << meta.dump(1) << "\n";
    std::printf("gpt_reference: %s, batch %dx%d, loss %.6f, %d AdamW steps to %s\n", config.describe().c_str(), B, T,
                loss, steps, dir.c_str());
  } catch (const std::exception& e) {
    std::fprintf(stderr, "gpt_reference: %s\n", e.what());
    return 1;
  }
  return 0;
}
