// DSpark draft model (docs/serving.md section 1, docs/model.md section 3.8): the checkpoint's dspark/ folder.
// Target residual-stream taps of every processed token are fused (fc + hidden_norm) into context
// K/V of the draft's layers; one parallel pass over a block of dspark_block_size slots (anchor +
// noise tokens, non-causal inside the block, windowed context) gives the slots' logits through the
// target's lm_head (or the draft's MXFP8 copy of it, quantize_wide_weights); the Markov head adds a
// low-rank bias from the previous draft token, slot by slot.
// The draft's K/V live in a KVView the caller owns (the engine keeps them in the target's pages).
#pragma once
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "formats/safetensors.h"
#include "base/aligned_vector.h"
#include "kernels/cpu/linear.h"
#include "model/config.h"
#include "model/kv_view.h"

namespace m3 {

class Model;

struct DSparkConfig {
  int n_layers = 0, hidden = 0, n_heads = 0, n_kv_heads = 0, head_dim = 0, rotary_dim = 0, vocab = 0;
  int inter = 0;            // dense_intermediate_size (dspark_ffn_hidden_size)
  int block_size = 0;       // dspark_block_size: slots per draft pass (anchor + noise)
  int noise_token = 0;      // dspark_noise_token_id
  int markov_rank = 0;      // dspark_markov_rank
  int sliding_window = 0;   // keys at positions >= query position - (sliding_window - 1)
  std::vector<int> target_layers;  // dspark_target_layer_ids (tap = output of that target layer)
  double rope_theta = 0;
  float rms_eps = 1e-6f;
  float swiglu_alpha = 1.702f, swiglu_limit = 7.0f, swiglu_beta = 1.0f;
  bool confidence_head = false;         // enable_confidence_head: the checkpoint has confidence_head.proj
  bool confidence_with_markov = true;   // confidence_head_with_markov: its input is [x_j ; markov_w1[prev_j]]
  WeightFormat format = WeightFormat::Plain;  // layer linears (fc is plain)
  std::string dir;

  // Reads DIR/config.json and checks it against the target (hidden size, vocabulary, layer ids).
  static DSparkConfig from_dir(const std::string& dir, const ModelConfig& target);
  // The draft's K/V lanes described as a ModelConfig (dense layers only), for a KV pool.
  ModelConfig kv_layout() const;
};

// Rows of target taps to turn into draft context: n tokens at positions start..start+n-1 of one
// sequence, taps rows [n, target_layers.size() * hidden].
struct DraftContextRows {
  KVView* kv;
  const float* taps;
  int64_t start;
  int64_t n;
};

// One sequence's draft block: the anchor (last sampled, not yet verified token) at position `pos`;
// its context is kv positions [0, pos). anchor_embed: the anchor's input embedding when it is not the
// token's row (an image placeholder, whose embedding is the image's: the target reads that one, and so
// does the draft, as vLLM's EAGLE drafters take the target's inputs_embeds); null: the anchor's row.
// The anchor is a prompt token only when the prompt's last token is computed in a decode step (a prefix
// hit or pulled P/D pages hold all the rest).
struct DraftQuery {
  const KVView* kv;
  int32_t anchor;
  int64_t pos;
  const float* anchor_embed = nullptr;
};

class DSparkDraft {
 public:
  // Loads DIR (config.json + safetensors); embeddings and lm_head come from `target`.
  DSparkDraft(const std::string& dir, const Model& target);
  ~DSparkDraft();

  const DSparkConfig& config() const { return cfg_; }
  int taps_width() const { return int(cfg_.target_layers.size()) * cfg_.hidden; }
  double bytes() const { return bytes_; }

  // Switches the layers' MXFP8 / NVFP4 linears to BF16 activations (Linear::act_bf16); returns how many
  // (0: the draft's layers are BF16 or fp32, which have no such path).
  int enable_bf16_activations();

  // Gives the draft MXFP8 copies of its wide matrices: its fc (read by every write_context) and the
  // target's lm_head (read by every propose()), each a BF16 / F16 / F32 matrix with in-features a
  // multiple of 32, quantised once here with the checkpoints' MXFP8 rule (formats/quantize.h), tiled,
  // and on BF16 activations when bf16_act (Linear::act_bf16); the draft then multiplies with the copies.
  // Why (speed): they are most of the bytes a draft pass and a context write read, and a BF16 matrix's
  // few-token step is bound by its decode (docs/benchmarks.md section 3.1); a copy reads about half the
  // bytes and, on BF16 dot products, needs no decode per token. Only the draft's proposals move:
  // verification compares the target with the distribution the drafts were drawn from. Returns the bytes
  // the copies hold (0: neither matrix qualifies, nothing done).
  size_t quantize_wide_weights(bool bf16_act);
  // The matrices the draft multiplies with: the copies above where made, else the checkpoints'.
  const Linear& lm_head() const;
  const Linear& fc() const { return fc_q_.L.empty() ? fc_ : fc_q_.L; }

  // Fuses the taps and stores the context K/V of every row (all draft layers).
  void write_context(const DraftContextRows* rows, int nrows);

  // Runs the block pass for every query and writes the pre-Markov logits z_j of the first `nslots`
  // slots: out[(q * nslots + j) * vocab ...]. nslots <= block_size.
  void propose(const DraftQuery* queries, int nq, int nslots, float* out);
  // The same with a slot count per query (each in 1..block_size): query q's rows follow those of the
  // queries before it, out[(nslots[0] + .. + nslots[q-1] + j) * vocab ...]. Only those rows go through
  // the lm_head (speed: at 32768+ words it is most of the pass, and adaptive speculation often wants
  // fewer drafts than the block has slots).
  void propose(const DraftQuery* queries, int nq, const int* nslots, float* out);

  // The confidence head (DSpark paper eq. 7; DeepSpec's AcceptRatePredictor): the predicted probability
  // that the draft of output row `row` of the last propose() is accepted given the drafts before it,
  // sigmoid(w · [x_row ; markov_w1[prev]] + b), fp32, where x_row is the slot's final-normed hidden
  // state (the lm_head's input) and prev the token the slot's Markov bias follows (the anchor for
  // slot 0, else the previous draft). Valid until the next propose() or write_context(). Throws when
  // the draft has no head.
  bool has_confidence() const { return !conf_w_.empty(); }
  float confidence(int64_t row, int32_t prev);
  // Output row `row`'s final-normed hidden state of the last propose() (the lm_head's input, the
  // head's x_row; hidden floats). Throws outside the last pass.
  const float* slot_hidden(int64_t row) const;

  // logits[0..vocab) += markov_w2 · markov_w1[prev]  (the Markov head's bias after token prev).
  void add_markov(int32_t prev, float* logits);
  // The same for n rows at once: logits[i] gets the bias after prev[i] (speed: one pass over the
  // Markov weights, block by block from L2, for all rows).
  void add_markov(const int32_t* prev, float* const* logits, int n);
  // dspark_draft_topk (vLLM's candidate-pruned Markov head): the bias after prev is added to the k
  // largest of logits[0..vocab) only (ties: lowest id), and every other logit becomes -infinity, so the
  // draft is drawn from the candidates; the distribution it is drawn from is what verification compares
  // with, so the output stays exact. Speed: k x rank products instead of vocab x rank.
  void add_markov_topk(int32_t prev, float* logits, int k);

 private:
  struct Layer;
  void ensure(int64_t rows);

  DSparkConfig cfg_;
  const Model& target_;
  std::unique_ptr<TensorStore> store_;
  Linear fc_, markov_w2_;
  const TensorView* markov_w1_ = nullptr;
  std::vector<float> hidden_norm_, final_norm_;
  std::vector<float> markov_w2t_;  // markov_w2 as fp32 [rank, vocab] (add_markov)
  std::vector<float> conf_w_;      // confidence_head.proj.weight as fp32 [hidden (+ rank)]; empty: no head
  float conf_b_ = 0;
  int64_t conf_rows_ = 0;          // output rows of the last propose() (their normed slots are in a_)
  std::vector<float> conf_w1_;     // markov_w1 row workspace of confidence()
  std::vector<Layer> layers_;
  struct Mxfp8Copy {  // quantize_wide_weights' copy of one matrix (L empty: none made)
    Linear L;
    AlignedVector<uint8_t> w, s;
  };
  Mxfp8Copy lm_head_q_, fc_q_;
  double bytes_ = 0;
  // Workspace, grown on demand.
  int64_t ws_rows_ = 0;
  AlignedVector<float> x_, a_, q_, k_, v_, att_, tmp_, g_, u_, cos_, sin_, w1row_, mk_;
  std::vector<int> slots_;
  std::vector<int32_t> cand_;  // add_markov_topk's candidate ids
  std::vector<float> cand_bias_;
};

}  // namespace m3
