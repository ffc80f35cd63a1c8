// data_test.cc: the training data and job files: corpus splitting, the byte and BPE tokenizers
// (round trips, merges learnt from counts worked out by hand), shards, preparation into train and
// validation splits, the sampler's determinism and its split over ranks, and job-file checks.
#include "src/training/data.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <filesystem>
#include <fstream>
#include <limits>
#include <set>

#include "chorus/error.hpp"
#include "src/training/job.h"
#include "src/training/loss_scale.h"

namespace chorus::training {
namespace {

namespace fs = std::filesystem;

struct TempDir {
  fs::path path = fs::temp_directory_path() / ("chorus_data_test_" + std::to_string(::getpid()));
  TempDir() { fs::create_directories(path); }
  ~TempDir() { fs::remove_all(path); }
  std::string file(const std::string& name, const std::string& text) const {
    std::ofstream(path / name) << text;
    return (path / name).string();
  }
};

TEST(DataTest, CorpusSplitsFortunesAndParagraphs) {
  TempDir dir;
  const auto fortunes = readCorpus(dir.file("f", "first one\n%\nsecond\n\nstill second\n%\n%\nthird\n"));
  EXPECT_EQ(fortunes, (std::vector<std::string>{"first one\n", "second\n\nstill second\n", "third\n"}));
  const auto paragraphs = readCorpus(dir.file("p", "a b\nc\n\n\nd\n"));
  EXPECT_EQ(paragraphs, (std::vector<std::string>{"a b\nc\n", "d\n"}));
  EXPECT_THROW(readCorpus((dir.path / "missing").string()), Error);
}

TEST(DataTest, BytesRoundTrip) {
  const auto tok = Tokenizer::bytes();
  const std::string text = "caf\xc3\xa9 \x01\xff";
  const auto t = tok.encode(text);
  EXPECT_EQ(t.size(), text.size());
  EXPECT_EQ(t[3], 0xc3);
  EXPECT_EQ(tok.decode(t), text);
  EXPECT_EQ(tok.vocab(), 256);
}

TEST(DataTest, BpeLearnsTheMostFrequentPairsFirst) {
  // Words: "aaab" x3 and " ab" x2. Pair counts: (a,a) 6, (a,b) 5, (' ',a) 2. First merge a+a
  // -> 256; then words are [256 a b] x3 and [' ' a b] x2: (a,b) 5 wins -> 257.
  const std::vector<std::string> docs = {"aaab aaab\n", "aaab ab ab\n"};
  const auto tok = Tokenizer::trainBpe(docs, 258);
  ASSERT_EQ(tok.vocab(), 258);
  EXPECT_EQ(tok.encode("aaab"), (std::vector<int>{256, 257}));
  EXPECT_EQ(tok.encode(" ab"), (std::vector<int>{' ', 257}));
  for (const std::string s : {"aaab ab\n", "b a aa \xff", ""}) EXPECT_EQ(tok.decode(tok.encode(s)), s);
  TempDir dir;
  const std::string path = (dir.path / "tok.json").string();
  tok.save(path);
  const auto back = Tokenizer::load(path);
  EXPECT_EQ(back.encode("aaab ab"), tok.encode("aaab ab"));
  EXPECT_EQ(back.kind(), "bpe");
}

TEST(DataTest, BpeOnFortunesCompressesAndRoundTrips) {
  const auto docs = readCorpus("/usr/share/games/fortunes/computers");
  const std::vector<std::string> some(docs.begin(), docs.begin() + std::min<size_t>(docs.size(), 300));
  const auto tok = Tokenizer::trainBpe(some, 512);
  EXPECT_EQ(tok.vocab(), 512);
  size_t bytes = 0, tokens = 0;
  for (const auto& d : some) {
    const auto t = tok.encode(d);
    ASSERT_EQ(tok.decode(t), d);
    bytes += d.size();
    tokens += t.size();
  }
  EXPECT_LT(static_cast<double>(tokens), 0.6 * bytes) << "512 merges-worth of vocabulary should shorten text";
}

TEST(DataTest, ShardsRoundTripAndRefuseDamage) {
  TempDir dir;
  const std::vector<int> small = {0, 1, 255, 65535}, wide = {70000, 3};
  writeShard((dir.path / "a.bin").string(), small, 65536);
  writeShard((dir.path / "b.bin").string(), wide, 70001);
  EXPECT_EQ(readShard((dir.path / "a.bin").string()), small);
  EXPECT_EQ(readShard((dir.path / "b.bin").string()), wide);
  EXPECT_EQ(fs::file_size(dir.path / "a.bin"), 16u + 2 * small.size());
  fs::resize_file(dir.path / "a.bin", 18);
  EXPECT_THROW(readShard((dir.path / "a.bin").string()), Error);
}

TEST(DataTest, PrepareSplitsDocumentsAndReusesItsWork) {
  TempDir dir;
  std::string text;
  for (int i = 0; i < 10; ++i) text += "doc " + std::to_string(i) + "\n%\n";
  DataSettings s;
  s.corpus = dir.file("corpus", text);
  s.valEvery = 5;  // documents 4 and 9 are held out
  s.shardTokens = 16;
  const std::string out = (dir.path / "prepared").string();
  const auto p = prepareData(s, out);
  EXPECT_FALSE(p.reused);
  EXPECT_EQ(p.vocab, 256);
  const auto val = loadSplit(out, "val");
  const auto train = loadSplit(out, "train");
  const auto tok = Tokenizer::bytes();
  EXPECT_EQ(tok.decode(val), "doc 4\n\ndoc 9\n\n");
  EXPECT_EQ(train.size(), p.trainTokens);
  EXPECT_EQ(p.trainShards, static_cast<int>((train.size() + 15) / 16));
  EXPECT_EQ(tok.decode(train).find("doc 4"), std::string::npos);
  EXPECT_TRUE(prepareData(s, out).reused);
  s.valEvery = 3;
  EXPECT_FALSE(prepareData(s, out).reused) << "other settings prepare again";
}

TEST(DataTest, SamplerIsDeterministicAndSplitsTheGlobalBatch) {
  std::vector<int> stream(1000);
  for (int i = 0; i < 1000; ++i) stream[i] = i;
  const int seq = 8;
  const Sampler sampler(&stream, seq, 42);
  EXPECT_EQ(sampler.windows(), 124u);  // (1000 - 1) / 8
  // One rank with 8 sequences equals 4 ranks x 2 and 2 ranks x 2 micro-batches x 2.
  std::vector<int> one(8 * seq), oneT(8 * seq);
  sampler.fill(3, 0, 0, 1, 8, 1, one.data(), oneT.data());
  std::vector<int> parts, partsAccum;
  for (int r = 0; r < 4; ++r) {
    std::vector<int> in(2 * seq), tg(2 * seq);
    sampler.fill(3, 0, r, 4, 2, 1, in.data(), tg.data());
    parts.insert(parts.end(), in.begin(), in.end());
  }
  for (int m = 0; m < 2; ++m) {
    for (int r = 0; r < 2; ++r) {
      std::vector<int> in(2 * seq), tg(2 * seq);
      sampler.fill(3, m, r, 2, 2, 2, in.data(), tg.data());
      partsAccum.insert(partsAccum.end(), in.begin(), in.end());
    }
  }
  EXPECT_EQ(parts, one);
  EXPECT_EQ(partsAccum, one);
  for (int i = 0; i < 8 * seq; ++i) EXPECT_EQ(oneT[i], one[i] + 1) << "targets are inputs shifted by one";
  // An epoch visits every window once; another seed, another order.
  std::set<int> starts;
  std::vector<int> in(seq), tg(seq);
  for (uint64_t g = 0; g < sampler.windows(); ++g) {
    sampler.sample(g, in.data(), tg.data());
    EXPECT_EQ(in[0] % seq, 0);
    starts.insert(in[0]);
  }
  EXPECT_EQ(starts.size(), sampler.windows());
  const Sampler other(&stream, seq, 43);
  std::vector<int> a(seq), b(seq), t(seq);
  sampler.sample(0, a.data(), t.data());
  other.sample(0, b.data(), t.data());
  sampler.sample(1, in.data(), t.data());
  std::vector<int> c(seq);
  other.sample(1, c.data(), t.data());
  EXPECT_TRUE(a != b || in != c);
}

// A small job file, for the job tests.
constexpr const char* kSmallJob = R"(name = "t"
[model]
layers = 2
heads = 2
width = 16
context = 32
[batch]
micro = 4
seq = 16
[parallel]
ranks = 2
[run]
steps = 7
out = "x"
)";

TEST(JobTest, ReadsOverridesAndNamesWhatIsWrong) {
  TempDir dir;
  const std::string path = dir.file("job.toml", kSmallJob);
  const Job job = loadJob(path, {"parallel.zero=3", "optimizer.lr=0.5", "run.out=\"y\""});
  EXPECT_EQ(job.model.layers, 2);
  EXPECT_EQ(job.model.vocab, 0) << "vocab from the tokenizer";
  EXPECT_EQ(job.zero, 3);
  EXPECT_FLOAT_EQ(job.optimizer.lr, 0.5f);
  EXPECT_EQ(job.out, "y");
  EXPECT_EQ(job.dataDir, "y/data");
  EXPECT_EQ(job.globalBatch(), 8);
  auto message = [&](const std::vector<std::string>& o) {
    try {
      loadJob(path, o);
    } catch (const Error& e) {
      return std::string(e.what());
    }
    return std::string("accepted");
  };
  EXPECT_NE(message({"parallel.zero=4"}).find("zero = 4"), std::string::npos);
  EXPECT_NE(message({"model.layer=3"}).find("unknown key 'layer' in [model]"), std::string::npos);
  EXPECT_NE(message({"extra.x=1"}).find("unknown section [extra]"), std::string::npos);
  EXPECT_NE(message({"parallel.inflight_buckets=0"}).find("inflight_buckets = 0"), std::string::npos);
  EXPECT_NE(message({"parallel.tp=3"}).find("ranks = 2 is not a multiple of tp x pp x cp = 3 x 1 x 1"),
            std::string::npos);
  // Context parallelism: ranks for it, and sequences that cut into 2 cp equal chunks.
  EXPECT_NE(message({"parallel.cp=4"}).find("ranks = 2 is not a multiple of tp x pp x cp = 1 x 1 x 4"),
            std::string::npos);
  EXPECT_NE(message({"parallel.cp=2", "batch.seq=6"}).find("seq = 6 with [parallel] cp = 2"), std::string::npos);
  const Job context = loadJob(path, {"parallel.cp=2", "batch.seq=8"});
  EXPECT_EQ(context.dp(), 1);
  EXPECT_EQ(context.globalBatch(), context.micro * context.accumulate);
  // Pipeline: ZeRO 0 or 1 only, the interleaved schedule with virtual stages only, micro-batches
  // that fill the interleaved schedule's groups, a block per chunk.
  EXPECT_NE(message({"parallel.pp=2", "parallel.zero=2"}).find("zero = 2 with pp = 2"), std::string::npos);
  EXPECT_NE(message({"parallel.pp=2", "parallel.vpp=2"}).find("vpp = 2"), std::string::npos);
  EXPECT_NE(message({"parallel.pp=2", "parallel.schedule=\"interleaved\""}).find("vpp = 1"), std::string::npos);
  EXPECT_NE(message({"parallel.pp=2", "parallel.schedule=\"interleaved\"", "parallel.vpp=2", "batch.accumulate=3"})
                .find("multiple of the 2 stages"),
            std::string::npos);
  EXPECT_NE(message({"parallel.pp=2", "parallel.schedule=\"interleaved\"", "parallel.vpp=2", "batch.accumulate=2"})
                .find("layers = 2 cannot give each of pp x vpp = 2 x 2"),
            std::string::npos);
  EXPECT_NE(message({"parallel.schedule=\"zigzag\""}).find("'zigzag'"), std::string::npos);
  // Gradient compression: all-reduced, so ZeRO 0 only; a warm-up of no fewer than 0 steps.
  EXPECT_NE(message({"compress.name=\"powersgd:4\"", "parallel.zero=1"})
                .find("[compress] name = \"powersgd:4\" with [parallel] zero = 1"),
            std::string::npos);
  EXPECT_NE(message({"compress.warmup_steps=-1"}).find("[compress] warmup_steps"), std::string::npos);
  EXPECT_NE(message({"compress.name=\"\""}).find("[compress] name is empty"), std::string::npos);
  const Job compressed = loadJob(path, {"compress.name=\"topk:0.01,ef=0\"", "compress.warmup_steps=7"});
  EXPECT_EQ(compressed.compress, "topk:0.01,ef=0");
  EXPECT_EQ(compressed.compressWarmup, 7);
  // Expert parallelism: MoE blocks to split, an ep dividing the dp ranks and the experts, no compression.
  EXPECT_NE(message({"parallel.ep=2"}).find("ep = 2 without experts"), std::string::npos);
  const std::vector<std::string> moe = {"model.experts=4"};
  auto withMoe = [&](std::vector<std::string> more) {
    more.insert(more.begin(), moe.begin(), moe.end());
    return more;
  };
  EXPECT_NE(message(withMoe({"parallel.ep=4"})).find("ep = 4 does not divide the 2 data-parallel ranks"),
            std::string::npos);
  EXPECT_NE(message(withMoe({"model.experts=3", "parallel.ep=2"})).find("ep = 2 does not divide [model] experts = 3"),
            std::string::npos);
  EXPECT_NE(message(withMoe({"parallel.ep=2", "compress.name=\"bf16\""})).find("with [parallel] ep = 2"),
            std::string::npos);
  EXPECT_EQ(loadJob(path, withMoe({"parallel.ep=2"})).ep, 2);
  // The optimizer: adamw (the default) or sgd with momentum in [0, 1).
  EXPECT_EQ(loadJob(path).optimizer.kind, kernels::Optimizer::kAdamW);
  const Job sgd = loadJob(path, {"optimizer.name=\"sgd\"", "optimizer.momentum=0.8", "optimizer.nesterov=true"});
  EXPECT_EQ(sgd.optimizer.kind, kernels::Optimizer::kSgd);
  EXPECT_FLOAT_EQ(sgd.optimizer.momentum, 0.8f);
  EXPECT_TRUE(sgd.optimizer.nesterov);
  EXPECT_NE(message({"optimizer.name=\"adam\""}).find("[optimizer] name = \"adam\": adamw or sgd"), std::string::npos);
  EXPECT_NE(message({"optimizer.momentum=1"}).find("[optimizer] momentum = 1 is not in [0, 1)"), std::string::npos);
  const Job pipeline = loadJob(path, {"parallel.pp=2", "batch.accumulate=3"});
  EXPECT_EQ(pipeline.dp(), 1);
  EXPECT_EQ(pipeline.globalBatch(), 12);
  const Job tensorParallel = loadJob(path, {"parallel.tp=2"});
  EXPECT_EQ(tensorParallel.dp(), 1);
  EXPECT_EQ(tensorParallel.globalBatch(), 4) << "the batch is split over data-parallel ranks only";
  // Mixed precision: a known compute type and reduction type, a loss scale of at least 1, and not
  // bf16 reduction and compression at once.
  const Job bf16 = loadJob(path, {"precision.compute=\"bf16\"", "precision.reduce=\"bf16\""});
  EXPECT_EQ(bf16.compute, "bf16");
  EXPECT_EQ(bf16.reduce, "bf16");
  EXPECT_NE(message({"precision.compute=\"fp8\""}).find("[precision] compute: compute precision 'fp8'"),
            std::string::npos);
  EXPECT_NE(message({"precision.reduce=\"fp16\""}).find("[precision] reduce = \"fp16\" is not fp32 or bf16"),
            std::string::npos);
  EXPECT_NE(message({"precision.loss_scale=0.5"}).find("[precision] loss_scale = 0.5"), std::string::npos);
  EXPECT_NE(message({"precision.growth_interval=0"}).find("[precision] growth_interval"), std::string::npos);
  EXPECT_NE(message({"precision.reduce=\"bf16\"", "compress.name=\"sign\""})
                .find("[precision] reduce = \"bf16\" with [compress] name = \"sign\""),
            std::string::npos);
  // Local SGD and DiLoCo: H steps of at least 1; ZeRO 0, no ep, cp or compression; evaluation and
  // checkpoints where the ranks agree.
  EXPECT_EQ(parseSync("every_step").kind, SyncMode::kEveryStep);
  EXPECT_EQ(parseSync("local:10").kind, SyncMode::kLocal);
  EXPECT_EQ(parseSync("local:10").every, 10);
  EXPECT_EQ(parseSync("diloco:50").kind, SyncMode::kDiloco);
  for (const char* wrong : {"local", "local:0", "diloco:x", "diloco:5x", "sometimes:3"}) {
    EXPECT_THROW(parseSync(wrong), Error) << wrong;
  }
  const Job local = loadJob(path, {"parallel.sync=\"diloco:5\"", "parallel.outer_lr=0.5"});
  EXPECT_EQ(local.sync, "diloco:5");
  EXPECT_DOUBLE_EQ(local.outerLr, 0.5);
  EXPECT_NE(message({"parallel.sync=\"local:0\""}).find("[parallel] sync 'local:0'"), std::string::npos);
  EXPECT_NE(message({"parallel.sync=\"local:4\"", "parallel.zero=2"}).find("sync = \"local:4\" with zero = 2"),
            std::string::npos);
  EXPECT_NE(message({"parallel.sync=\"local:4\"", "run.checkpoint_every=6"}).find("checkpoint_every = 6"),
            std::string::npos);
  EXPECT_EQ(loadJob(path, {"parallel.sync=\"local:4\"", "run.checkpoint_every=8"}).checkpointEvery, 8);
  // Offload: the targets by name, parameters in the file only with ZeRO-3 and the optimizer state
  // there too, a positive window; the files under the output directory unless told otherwise.
  const Job offloaded = loadJob(path, {"offload.optimizer=\"file\"", "run.out=\"o\""});
  EXPECT_EQ(offloaded.offload().optimizer, OffloadTarget::kFile);
  EXPECT_EQ(offloaded.offload().directory, "o/offload");
  EXPECT_EQ(offloaded.offload().windowBytes, 64u << 20);
  EXPECT_NE(message({"offload.optimizer=\"nvme\""}).find("offload target 'nvme'"), std::string::npos);
  EXPECT_NE(message({"offload.io=\"aio\""}).find("offload io 'aio'"), std::string::npos);
  EXPECT_NE(message({"offload.optimizer=\"file\"", "offload.params=\"file\"", "parallel.zero=2"})
                .find("params = \"file\" with zero = 2"),
            std::string::npos);
  EXPECT_NE(message({"offload.optimizer=\"host\"", "offload.params=\"file\"", "parallel.zero=3"})
                .find("optimizer = \"host\""),
            std::string::npos);
  EXPECT_NE(message({"offload.window_mb=0"}).find("window_mb = 0"), std::string::npos);
  // The step during backward: only where nothing of it waits for the whole gradient.
  EXPECT_TRUE(loadJob(path, {"optimizer.in_backward=true", "optimizer.clip=0"}).stepInBackward);
  EXPECT_NE(message({"optimizer.in_backward=true"}).find("in_backward = true with clip = 1"), std::string::npos);
  EXPECT_NE(message({"optimizer.in_backward=true", "optimizer.clip=0", "precision.compute=\"fp16\""})
                .find("compute = \"fp16\""),
            std::string::npos);
  EXPECT_NE(message({"optimizer.in_backward=true", "optimizer.clip=0", "parallel.ranks=2", "parallel.pp=2"})
                .find("with pp = 2"),
            std::string::npos);
  EXPECT_NE(message({"optimizer.in_backward=true", "optimizer.clip=0", "parallel.sync=\"local:4\"",
                     "run.checkpoint_every=8", "run.eval_every=8"})
                .find("sync = \"local:4\""),
            std::string::npos);
  EXPECT_NE(message({"optimizer.in_backward=true", "optimizer.clip=0", "offload.optimizer=\"file\"",
                     "offload.params=\"file\"", "parallel.zero=3"})
                .find("params = \"file\""),
            std::string::npos);
  EXPECT_NE(message({"parallel.sync=\"local:4\"", "run.eval_every=6"}).find("eval_every = 6"), std::string::npos);
  EXPECT_NE(message({"parallel.sync=\"diloco:4\"", "parallel.outer_momentum=1"}).find("outer_momentum = 1"),
            std::string::npos);
  EXPECT_NE(message({"parallel.sync=\"local:4\"", "compress.name=\"bf16\""}).find("with [compress]"),
            std::string::npos);
  EXPECT_EQ(loadJob(path, {"parallel.sync=\"diloco:4\"", "compress.name=\"bf16\""}).compress, "bf16");
  // The device: cpu (the default) or cuda; what runs on the CPU only is refused on cuda by its key.
  EXPECT_EQ(loadJob(path).device, "cpu");
  EXPECT_EQ(loadJob(path, {"run.device=\"cuda\"", "parallel.zero=3", "precision.compute=\"bf16\""}).device, "cuda");
  EXPECT_EQ(loadJob(path, {"run.device=\"cuda\"", "parallel.pp=2", "precision.reduce=\"bf16\""}).pp, 2);
  EXPECT_EQ(loadJob(path, {"run.device=\"cuda\"", "model.experts=4", "parallel.ep=2"}).ep, 2);
  EXPECT_NE(message({"run.device=\"gpu\""}).find("[run] device \"gpu\": expected \"cpu\" or \"cuda\""),
            std::string::npos);
  EXPECT_EQ(loadJob(path, {"run.device=\"cuda\"", "offload.optimizer=\"host\""}).offload().optimizer,
            OffloadTarget::kHost);
  EXPECT_EQ(loadJob(path, {"run.device=\"cuda\"", "parallel.sync=\"diloco:4\""}).sync, "diloco:4");
  EXPECT_EQ(loadJob(path, {"run.device=\"cuda\"", "compress.name=\"powersgd:4\""}).compress, "powersgd:4");
  // Profiling times a device's calls: taken with cuda, refused on the CPU by name.
  EXPECT_TRUE(loadJob(path, {"run.device=\"cuda\"", "run.profile=true"}).profile);
  EXPECT_FALSE(loadJob(path).profile);
  EXPECT_NE(message({"run.profile=true"}).find("[run] profile = true times a device's calls: it needs device"),
            std::string::npos);
  // Taken on a device as on the CPU.
  EXPECT_TRUE(loadJob(path, {"run.device=\"cuda\"", "optimizer.in_backward=true", "optimizer.clip=0"}).stepInBackward);
  EXPECT_EQ(
      loadJob(path, {"run.device=\"cuda\"", "parallel.zero=3", "offload.optimizer=\"file\"", "offload.params=\"file\""})
          .offloadParams,
      "file");
  EXPECT_NE(message({"batch.seq=64"}).find("exceeds [model] context = 32"), std::string::npos);
  EXPECT_NE(message({"batch.micro=\"four\""}).find("[batch] micro must be an integer"), std::string::npos);
  EXPECT_NE(message({"nonsense"}).find("not section.key=value"), std::string::npos);
  EXPECT_NE(message({}).find("accepted"), std::string::npos);
}

TEST(JobTest, ABaseFileGivesWhatTheJobDoesNotSet) {
  TempDir dir;
  dir.file("base.toml", kSmallJob);
  const std::string path = dir.file("job.toml", R"(base = "base.toml"
name = "derived"
[batch]
micro = 1
[parallel]
ranks = 8
pp = 2
)");
  const Job job = loadJob(path, {"parallel.tp=2"});
  EXPECT_EQ(job.name, "derived");
  EXPECT_EQ(job.model.layers, 2);
  EXPECT_EQ(job.micro, 1);
  EXPECT_EQ(job.steps, 7);
  EXPECT_EQ(job.out, "x");
  EXPECT_EQ(job.seq, 16);
  EXPECT_EQ(job.ranks, 8);
  EXPECT_EQ(job.dp(), 2);
  const std::string loop = dir.file("loop.toml", "base = \"loop.toml\"\n");
  try {
    loadJob(loop);
    ADD_FAILURE() << "a job that is its own base was accepted";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("names itself"), std::string::npos) << e.what();
  }
  EXPECT_THROW(loadJob(dir.file("missing.toml", "base = \"nowhere.toml\"\n")), Error);
}

TEST(LossScaleTest, HalvesOnOverflowSkipsAndGrowsAfterCleanSteps) {
  LossScale scale(true, 1024.0, 3);
  EXPECT_TRUE(scale.update(1.5));
  EXPECT_TRUE(scale.update(0.5));
  EXPECT_EQ(scale.scale(), 1024.0);
  EXPECT_TRUE(scale.update(2.0));  // the third clean step in a row doubles it
  EXPECT_EQ(scale.scale(), 2048.0);
  EXPECT_FALSE(scale.update(std::numeric_limits<double>::infinity()));
  EXPECT_FALSE(scale.update(std::nan("")));
  EXPECT_EQ(scale.scale(), 512.0);
  EXPECT_EQ(scale.skipped(), 2);
  EXPECT_TRUE(scale.update(1.0));
  EXPECT_TRUE(scale.update(1.0));
  EXPECT_EQ(scale.cleanRun(), 2);  // an overflow started the count again
  EXPECT_EQ(scale.scale(), 512.0);
  scale.restore(8.0, 5, 2);
  EXPECT_TRUE(scale.update(1.0));
  EXPECT_EQ(scale.scale(), 16.0);
  EXPECT_EQ(scale.skipped(), 5);
  // Without fp16 the scale is 1 and stays so; an overflow still skips the step.
  LossScale fixed(false, 1024.0, 1);
  EXPECT_EQ(fixed.scale(), 1.0);
  EXPECT_TRUE(fixed.update(3.0));
  EXPECT_FALSE(fixed.update(std::numeric_limits<double>::infinity()));
  EXPECT_EQ(fixed.scale(), 1.0);
  EXPECT_EQ(fixed.skipped(), 1);
}

TEST(JobTest, LearningRateWarmsUpThenDecays) {
  Job job;
  job.optimizer.lr = 1.0f;
  job.minLr = 0.1f;
  job.warmup = 10;
  job.steps = 110;
  EXPECT_FLOAT_EQ(job.learningRate(1), 0.1f);
  EXPECT_FLOAT_EQ(job.learningRate(10), 1.0f);
  EXPECT_NEAR(job.learningRate(60), 0.55f, 1e-6);  // halfway through the cosine
  EXPECT_NEAR(job.learningRate(110), 0.1f, 1e-6);
}

}  // namespace
}  // namespace chorus::training
