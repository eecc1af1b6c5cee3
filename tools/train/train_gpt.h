/* weft-train's transformer: GPT-2's shape (token and position embeddings,
 * pre-norm blocks of causal multi-head attention and a GELU MLP, a final
 * layer norm, the output projection tied to the token embedding) on the
 * host or a GPU (train_gpt_exec.h), its parameters held by a weft ZeRO
 * context in layers:
 *
 *   layer 0         wte (vocab x C), wpe (context x C)
 *   layer 1 + l     block l: ln1 w, b; qkv w (3C x C), b; attention
 *                   projection w (C x C), b; ln2 w, b; fc w (4C x C), b;
 *                   fc projection w (C x 4C), b
 *   layer 1 + L     the final layer norm's w, b
 *
 * wte is one parameter used twice (the embedding and the logits): its
 * gradient is the sum of both, reduced once when layer 0 is done at the end
 * of backward. */
#ifndef WEFT_TRAIN_GPT_H
#define WEFT_TRAIN_GPT_H

#include "train_model.h"
#include "train_opts.h"

#ifdef __cplusplus
extern "C" {
#endif

/* The named shapes of --model: 0, or -1 for a name it does not know. */
int train_gpt_shape_named(const char *name, struct train_gpt_shape *out);
/* Parameters of a shape. */
size_t train_gpt_param_count(const struct train_gpt_shape *s);

/* What train_run is for the MLP, for o->model TRAIN_MODEL_GPT (weft-train
 * picks one by the model). */
weftResult_t train_gpt_run(weftComm_t comm, const struct train_opts *o, struct train_result *res);

#ifdef __cplusplus
}
#endif
#endif
