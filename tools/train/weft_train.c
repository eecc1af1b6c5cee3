/* weft-train: trains a GPT-2-shaped transformer (--model tiny, mid, gpt2)
 * on text, or a small MLP (--model mlp), with ZeRO stage 0-3 on ranks
 * started by weftrun (or any launcher weftCommInitFromEnv knows).
 *
 *   weftrun -n 4 weft-train --zero-stage 3 --steps 20 --dtype bf16
 *
 * Prints the loss per step, the memory each rank holds, and last
 *   final loss L params-l2 X params-sum Y
 * so that runs compare at a glance (L is "none" where no step ran). */
#include <ctype.h>
#include <errno.h>
#include <getopt.h>
#include <limits.h>
#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "train_data.h"
#include "train_gpt.h"
#include "train_model.h"

static void usage(FILE *f) {
  fprintf(f,
          "usage: weft-train [options]\n"
          "  --model M          tiny (default: 5 layers, 4 heads, 128 channels, context 64),\n"
          "                     mid (6, 6, 384, 256), gpt2 (12, 12, 768, 1024): GPT-2-shaped\n"
          "                     transformers on bytes (vocabulary 256); mlp: the MLP\n"
          "  --zero-stage N     0 (all-reduce), 1, 2 or 3 (default 0)\n"
          "  --steps N          total steps (default 10; transformers 60); 0: none, the\n"
          "                     model as it starts or resumes (memory table, sample)\n"
          "  --stop-at N        stop after step N (the schedule still spans --steps)\n"
          "  --seed N           data and initialisation seed (default 1)\n"
          "  --dtype T          fp32, bf16 or fp16 parameters and gradients (default fp32)\n"
          "  --reduce-dtype T   reduce gradients in T: the parameter type or fp32\n"
          "  --optimizer O      adamw or sgd (SGD with momentum 0.9) (default adamw)\n"
          "  --lr X             learning rate, the peak of the schedule (default 0.01;\n"
          "                     transformers 0.0015)\n"
          "  --lr-schedule S    const or cosine (default const; transformers cosine)\n"
          "  --warmup N         cosine: steps of linear warm-up (default steps / 10)\n"
          "  --min-lr X         cosine: the last step's rate, a fraction of --lr, 0 to 1\n"
          "                     (default 0.1)\n"
          "  --clip X           clip gradients to this global norm, 0: off (default off;\n"
          "                     transformers 1)\n"
          "  --weight-decay X   weight decay of the weight matrices (and the transformers'\n"
          "                     embeddings), as GPT-2's trainers: decoupled with adamw,\n"
          "                     added to the gradient with sgd; biases and layer norms are\n"
          "                     not decayed (default 0: none)\n"
          "  --skip-limit N     fp32 and bf16: fail the run after N steps in a row skipped\n"
          "                     for a non-finite gradient (default %d); fp16 fails where a\n"
          "                     step overflows at the least loss scale, 1\n"
          "  --accum N          micro-steps per step (default 1)\n"
          "  --reduce-every-micro-step  stages 2-3 with --accum: reduce-scatter every\n"
          "                     micro-step's gradients into the shard (Psi/N of gradients\n"
          "                     held, --accum times the traffic) instead of summing them\n"
          "                     locally until the last (refused at stages 0-1)\n"
          "  --batch N          global batch per step: samples, or sequences (default 24);\n"
          "                     --accum x ranks must divide it\n"
          "  --gather-bound B   stage 3: bytes of gathered layers at most, 0: no bound; at\n"
          "                     least the layers computed at once (refused below, naming it)\n"
          "  --prefetch N       stage 3: layers gathered ahead (default 1)\n"
          "  --save DIR         write a sharded checkpoint after the last step\n"
          "  --resume DIR       continue from the checkpoint in DIR\n"
          "  --device D         host (default) or cuda: the model and its ZeRO state on the\n"
          "                     rank's GPU (GPU local rank %% GPUs)\n"
          "  --offload-optimizer with --device cuda: the fp32 master weights, the moments\n"
          "                     and the optimizer's step in the host's pinned memory and\n"
          "                     cores (ZeRO-Offload); the GPU holds parameters and gradients\n"
          "  --quiet            print the final line only\n"
          "transformers:\n"
          "  --seq N            tokens per sequence (default: the context)\n"
          "  --data FILE        text to train on (default: the files of %s)\n"
          "  --tokens FILE      its token file, written once (default: in $TMPDIR); with\n"
          "                     --data, written again where it holds another text; alone,\n"
          "                     used as it is\n"
          "  --val-every N      validation loss every N steps (default 20; 0: never)\n"
          "  --val-batches N    global batches (--batch sequences) of held-out text per\n"
          "                     validation, spread over it, at most all of it; or all:\n"
          "                     every window of it (default 2); the same windows for any\n"
          "                     --accum and rank count\n"
          "  --sample N         bytes generated at the end (default 96)\n"
          "  --temperature X    of the sample; 0: greedy (default 0.8)\n"
          "  --dump-init FILE   write the parameters before the first step (as\n"
          "                     weft-zero-consolidate does)\n"
          "  --dump-batches FILE write every micro-step's global batch of token windows\n"
          "  --device sim       the --device cuda path's kernels and calls, run on the host\n"
          "                     (a check of the GPU code without a GPU)\n"
          "the MLP:\n"
          "  --layers N         linear layers, 1 to 8 (default 3)\n"
          "  --width N          width of every hidden layer, at most %d: a layer's width x\n"
          "                     width weights are indexed by int (default 37, 29)\n",
          TRAIN_SKIP_LIMIT, TRAIN_DATA_DEFAULT_DIR, TRAIN_MAX_WIDTH);
}

static int parse_dtype(const char *s, weftDataType_t *out) {
  if (strcmp(s, "fp32") == 0) *out = weftFloat32;
  else if (strcmp(s, "bf16") == 0) *out = weftBfloat16;
  else if (strcmp(s, "fp16") == 0) *out = weftFloat16;
  else return -1;
  return 0;
}

static const struct option longopts[] = {
    {"zero-stage", required_argument, NULL, 'z'}, {"steps", required_argument, NULL, 's'},
    {"seed", required_argument, NULL, 'S'},       {"dtype", required_argument, NULL, 'd'},
    {"reduce-dtype", required_argument, NULL, 'r'}, {"optimizer", required_argument, NULL, 'o'},
    {"lr", required_argument, NULL, 'l'},         {"clip", required_argument, NULL, 'c'},
    {"accum", required_argument, NULL, 'a'},      {"batch", required_argument, NULL, 'b'},
    {"gather-bound", required_argument, NULL, 'g'}, {"prefetch", required_argument, NULL, 'p'},
    {"save", required_argument, NULL, 'w'},       {"resume", required_argument, NULL, 'R'},
    {"layers", required_argument, NULL, 'L'},   {"width", required_argument, NULL, 'W'},
    {"quiet", no_argument, NULL, 'q'},            {"help", no_argument, NULL, 'h'},
    {"device", required_argument, NULL, 'D'},     {"offload-optimizer", no_argument, NULL, 'O'},
    {"model", required_argument, NULL, 'm'},      {"seq", required_argument, NULL, 'T'},
    {"data", required_argument, NULL, 'f'},       {"tokens", required_argument, NULL, 'k'},
    {"val-every", required_argument, NULL, 'v'},  {"val-batches", required_argument, NULL, 'V'},
    {"sample", required_argument, NULL, 'n'},     {"temperature", required_argument, NULL, 't'},
    {"lr-schedule", required_argument, NULL, 'x'}, {"warmup", required_argument, NULL, 'u'},
    {"min-lr", required_argument, NULL, 'y'},     {"dump-init", required_argument, NULL, 'i'},
    {"dump-batches", required_argument, NULL, 'j'}, {"stop-at", required_argument, NULL, 'e'},
    {"reduce-every-micro-step", no_argument, NULL, 'E'},
    {"skip-limit", required_argument, NULL, 'K'},
    {"weight-decay", required_argument, NULL, 'P'},
    {NULL, 0, NULL, 0}};

/* The flags that one model reads and the other would ignore (the usage's
 * "transformers:" and "the MLP:" groups): given for the other model, they
 * are refused rather than dropped. --device sim is the transformers' too,
 * checked where the model is known. */
static const char kGptFlags[] = "TfkvVntij";
static const char kMlpFlags[] = "LW";

/* The name of the option getopt_long returned as c. */
static const char *flag_name(int c) {
  for (const struct option *p = longopts; p->name != NULL; p++)
    if (p->val == c) return p->name;
  return "?";
}

/* The numeric flags: the whole of s, in [lo, hi] (and finite), or -1 with
 * the flag, the value and the range on stderr, for an exit 2 as every usage
 * error. */
static int arg_whole(int c, const char *s, unsigned long long lo, unsigned long long hi,
                     const char *why, unsigned long long *out) {
  char *end = (char *)s; /* no sign, no space */
  errno = 0;
  unsigned long long v = isdigit((unsigned char)s[0]) ? strtoull(s, &end, 10) : 0;
  if (end == s || *end != '\0' || errno != 0 || v < lo || v > hi) {
    fprintf(stderr, "weft-train: --%s %s: a whole number from %llu to %llu%s%s%s\n", flag_name(c),
            s, lo, hi, why != NULL ? " (" : "", why != NULL ? why : "", why != NULL ? ")" : "");
    return -1;
  }
  *out = v;
  return 0;
}

static int arg_int(int c, const char *s, int lo, int hi, int *out) {
  unsigned long long v;
  if (arg_whole(c, s, (unsigned long long)lo, (unsigned long long)hi, NULL, &v) != 0) return -1;
  *out = (int)v;
  return 0;
}

static int arg_real(int c, const char *s, double lo, double hi, const char *what, double *out) {
  char *end = (char *)s;
  double v = isspace((unsigned char)s[0]) ? 0 : strtod(s, &end);
  if (end == s || *end != '\0' || !isfinite(v) || v < lo || v > hi) {
    if (isinf(hi))
      fprintf(stderr, "weft-train: --%s %s: %s, a finite number of at least %g\n", flag_name(c),
              s, what, lo);
    else
      fprintf(stderr, "weft-train: --%s %s: %s, a number from %g to %g\n", flag_name(c), s, what,
              lo, hi);
    return -1;
  }
  *out = v;
  return 0;
}

int main(int argc, char **argv) {
  struct train_opts o;
  train_opts_defaults(&o);
  o.log = stdout;
  int reduce_set = 0, layers = 0, width = 0;
  int steps_set = 0, lr_set = 0, clip_set = 0, sched_set = 0, warmup = -1;
  unsigned long long whole;
  const char *model = "tiny";
  int c;
  int gpt_flag = 0, mlp_flag = 0; /* the first flag of each model's own given */
  while ((c = getopt_long(argc, argv, "h", longopts, NULL)) != -1) {
    if (c != '?' && c != ':') {
      if (gpt_flag == 0 && strchr(kGptFlags, c) != NULL) gpt_flag = c;
      if (mlp_flag == 0 && strchr(kMlpFlags, c) != NULL) mlp_flag = c;
    }
    switch (c) {
    case 'z':
      if (arg_int(c, optarg, 0, 3, &o.stage) != 0) return 2;
      break;
    case 's': /* 0: no step, the model as it starts or resumes (its memory, its sample) */
      if (arg_int(c, optarg, 0, INT_MAX, &o.steps) != 0) return 2;
      steps_set = 1;
      break;
    case 'S':
      if (arg_whole(c, optarg, 0, ULONG_MAX, NULL, &whole) != 0) return 2;
      o.seed = (unsigned long)whole;
      break;
    case 'd':
      if (parse_dtype(optarg, &o.dtype) != 0) {
        fprintf(stderr, "weft-train: --dtype %s: fp32, bf16 or fp16\n", optarg);
        return 2;
      }
      break;
    case 'r':
      if (parse_dtype(optarg, &o.reduce_type) != 0) {
        fprintf(stderr, "weft-train: --reduce-dtype %s: fp32, bf16 or fp16\n", optarg);
        return 2;
      }
      reduce_set = 1;
      break;
    case 'o':
      if (strcmp(optarg, "adamw") == 0) o.optimizer = weftZeroAdamW;
      else if (strcmp(optarg, "sgd") == 0) o.optimizer = weftZeroSgdMomentum;
      else {
        fprintf(stderr, "weft-train: --optimizer %s: adamw or sgd\n", optarg);
        return 2;
      }
      break;
    case 'l':
      if (arg_real(c, optarg, 0, INFINITY, "the peak learning rate", &o.lr) != 0) return 2;
      lr_set = 1;
      break;
    case 'c':
      if (arg_real(c, optarg, 0, INFINITY, "a gradient norm (0: off)", &o.clip) != 0) return 2;
      clip_set = 1;
      break;
    case 'P':
      if (arg_real(c, optarg, 0, INFINITY, "a weight decay (0: none)", &o.weight_decay) != 0)
        return 2;
      break;
    case 'a':
      if (arg_int(c, optarg, 1, INT_MAX, &o.accum) != 0) return 2;
      break;
    case 'b':
      if (arg_int(c, optarg, 1, INT_MAX, &o.global_batch) != 0) return 2;
      break;
    case 'g':
      if (arg_whole(c, optarg, 0, SIZE_MAX, "bytes", &whole) != 0) return 2;
      o.gather_bound = (size_t)whole;
      break;
    case 'p':
      if (arg_int(c, optarg, 0, INT_MAX, &o.prefetch) != 0) return 2;
      break;
    case 'w': o.save = optarg; break;
    case 'R': o.resume = optarg; break;
    case 'L':
      if (arg_int(c, optarg, 1, TRAIN_MAX_LAYERS, &layers) != 0) return 2;
      break;
    case 'W':
      if (arg_whole(c, optarg, 1, TRAIN_MAX_WIDTH,
                    "a layer's width x width weights are indexed by int", &whole) != 0)
        return 2;
      width = (int)whole;
      break;
    case 'q': o.log = NULL; break;
    case 'D':
      if (strcmp(optarg, "host") != 0 && strcmp(optarg, "cuda") != 0 &&
          strcmp(optarg, "sim") != 0) {
        fprintf(stderr, "weft-train: --device %s: host, cuda or sim\n", optarg);
        return 2;
      }
      o.device = strcmp(optarg, "cuda") == 0;
      o.device_sim = strcmp(optarg, "sim") == 0;
      break;
    case 'O': o.offload_optimizer = 1; break;
    case 'E': o.reduce_every = 1; break;
    case 'm': model = optarg; break;
    case 'T': /* at most the model's context, checked below */
      if (arg_int(c, optarg, 1, INT_MAX, &o.seq) != 0) return 2;
      break;
    case 'f': o.data = optarg; break;
    case 'k': o.tokens = optarg; break;
    case 'v':
      if (arg_int(c, optarg, 0, INT_MAX, &o.val_every) != 0) return 2;
      break;
    case 'V':
      if (strcmp(optarg, "all") == 0) o.val_batches = TRAIN_VAL_ALL;
      else if (arg_whole(c, optarg, 0, INT_MAX, "or all", &whole) != 0) return 2;
      else o.val_batches = (int)whole;
      break;
    case 'K':
      if (arg_int(c, optarg, 1, INT_MAX, &o.skip_limit) != 0) return 2;
      break;
    case 'n':
      if (arg_whole(c, optarg, 0, TRAIN_MAX_SAMPLE, "bytes, counted in an int", &whole) != 0)
        return 2;
      o.sample_len = (int)whole;
      break;
    case 't':
      if (arg_real(c, optarg, 0, INFINITY, "the sample's temperature (0: greedy)",
                   &o.temperature) != 0)
        return 2;
      break;
    case 'u':
      if (arg_int(c, optarg, 0, INT_MAX, &warmup) != 0) return 2;
      break;
    case 'y':
      if (arg_real(c, optarg, 0, 1, "the last step's rate, a fraction of --lr", &o.min_lr_frac) !=
          0)
        return 2;
      break;
    case 'i': o.dump_init = optarg; break;
    case 'j': o.dump_batches = optarg; break;
    case 'e':
      if (arg_int(c, optarg, 1, INT_MAX, &o.stop_at) != 0) return 2;
      break;
    case 'x':
      if (strcmp(optarg, "const") != 0 && strcmp(optarg, "cosine") != 0) {
        fprintf(stderr, "weft-train: --lr-schedule %s: const or cosine\n", optarg);
        return 2;
      }
      o.cosine = strcmp(optarg, "cosine") == 0;
      sched_set = 1;
      break;
    case 'h': usage(stdout); return 0;
    default: usage(stderr); return 2;
    }
  }
  if (optind < argc) {
    usage(stderr);
    return 2;
  }
  if (!reduce_set) o.reduce_type = o.dtype;
  if (o.reduce_every && o.stage < 2) {
    fprintf(stderr, "weft-train: --reduce-every-micro-step: stages 2-3, whose gradients are a "
                    "shard; stage %d holds them whole and reduces once a step\n", o.stage);
    return 2;
  }
  if (o.offload_optimizer && !o.device) {
    fprintf(stderr, "weft-train: --offload-optimizer moves a GPU's optimizer state to the host: "
                    "it needs --device cuda\n");
    return 2;
  }
  if (strcmp(model, "mlp") != 0) {
    if (train_gpt_shape_named(model, &o.gpt) != 0) {
      fprintf(stderr, "weft-train: --model %s: tiny, mid, gpt2 or mlp\n", model);
      return 2;
    }
    if (mlp_flag != 0) {
      fprintf(stderr, "weft-train: --%s shapes the MLP (--model mlp); --model %s is a "
                      "transformer of a fixed shape\n", flag_name(mlp_flag), model);
      return 2;
    }
    o.model = TRAIN_MODEL_GPT;
    if (!steps_set) o.steps = 60;
    if (!lr_set) o.lr = 1.5e-3;
    if (!clip_set) o.clip = 1.0;
    if (!sched_set) o.cosine = 1;
    if (o.seq > o.gpt.context) {
      fprintf(stderr, "weft-train: --seq %d: at most the context of --model %s, %d\n", o.seq,
              model, o.gpt.context);
      return 2;
    }
  } else if (o.device_sim) {
    fprintf(stderr, "weft-train: --device sim runs the transformer's kernels only\n");
    return 2;
  } else if (gpt_flag != 0) {
    fprintf(stderr, "weft-train: --%s is a transformer's (--model tiny, mid or gpt2); the MLP "
                    "(--model mlp) has no use for it\n", flag_name(gpt_flag));
    return 2;
  }
  if (warmup < 0) warmup = o.steps / 10 > 0 ? o.steps / 10 : 1;
  o.warmup = warmup;
  if (layers != 0 || width != 0) {
    if (layers == 0) layers = o.nlayers;
    int out = o.widths[o.nlayers];
    for (int l = 1; l < layers; l++)
      if (width > 0 || l >= o.nlayers) o.widths[l] = width > 0 ? width : 29;
    o.widths[layers] = out;
    o.nlayers = layers;
  }

  const char *local = getenv("WEFT_LOCAL_RANK");
  o.local_rank = local != NULL ? atoi(local) : 0;
  weftComm_t comm;
  if (weftCommInitFromEnv(&comm, NULL) != weftSuccess) {
    fprintf(stderr, "weft-train: joining the job failed: %s\n", weftGetLastError(NULL));
    return 1;
  }
  int rank, nranks;
  weftCommUserRank(comm, &rank);
  weftCommCount(comm, &nranks);
  /* the batch's share of a rank: every rank decides alike, before any step */
  if (o.global_batch % ((long long)o.accum * nranks) != 0) {
    if (rank == 0)
      fprintf(stderr, "weft-train: --batch %d does not divide by --accum %d x %d ranks: a "
                      "rank's micro-step takes batch / (accum x ranks) %s\n",
              o.global_batch, o.accum, nranks,
              o.model == TRAIN_MODEL_GPT ? "sequences" : "samples");
    weftCommDestroy(comm);
    return 2;
  }
  struct train_result r;
  weftResult_t res = o.model == TRAIN_MODEL_GPT ? train_gpt_run(comm, &o, &r)
                                                 : train_run(comm, &o, &r);
  if (res != weftSuccess) {
    const char *text = weftZeroLastError();
    if (text[0] == '\0') text = weftGetLastError(NULL);
    /* the trainer's own refusals (an option the job cannot take, a run that
     * diverged) have said why on stderr and left no text */
    const int said = text[0] == '\0' && (res == weftInvalidArgument || res == weftInvalidUsage);
    if (!said)
      fprintf(stderr, "weft-train: rank %d: %s%s%s\n", rank, weftGetErrorString(res),
              text[0] != '\0' ? ": " : "", text);
    weftCommAbort(comm);
    /* options the job refuses before training are usage errors */
    return res == weftInvalidArgument ? 2 : 1;
  }
  const int diverged = r.steps_run > 0 && !isfinite(r.final_loss);
  if (rank == 0) {
    char loss[32] = "none"; /* no step ran: no loss to compare */
    if (r.steps_run > 0) snprintf(loss, sizeof loss, "%.17g", r.final_loss);
    printf("final loss %s params-l2 %.17g params-sum %.17g\n", loss, r.l2, r.sum);
    if (diverged)
      fprintf(stderr, "weft-train: the final loss is not finite (%s): the run diverged\n", loss);
  }
  free(r.params);
  weftCommDestroy(comm);
  return diverged ? 1 : 0;
}
