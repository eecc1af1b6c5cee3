/* weft-train: trains a small MLP with ZeRO stage 0-3 on ranks started by
 * weftrun (or any launcher weftCommInitFromEnv knows).
 *
 *   weftrun -n 4 weft-train --zero-stage 3 --steps 20 --dtype bf16
 *
 * Prints the loss per step, the memory each rank holds, and last
 *   final loss L params-l2 X params-sum Y
 * so that runs compare at a glance. */
#include <getopt.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "train_model.h"

static void usage(FILE *f) {
  fprintf(f,
          "usage: weft-train [options]\n"
          "  --zero-stage N     0 (all-reduce), 1, 2 or 3 (default 0)\n"
          "  --steps N          total steps (default 10)\n"
          "  --seed N           data and initialisation seed (default 1)\n"
          "  --dtype T          fp32, bf16 or fp16 parameters and gradients (default fp32)\n"
          "  --reduce-dtype T   reduce gradients in T: the parameter type or fp32\n"
          "  --optimizer O      adamw or sgd (SGD with momentum 0.9) (default adamw)\n"
          "  --lr X             learning rate (default 0.01)\n"
          "  --clip X           clip gradients to this global norm (default off)\n"
          "  --accum N          micro-steps per step (default 1)\n"
          "  --batch N          global batch per step (default 24)\n"
          "  --gather-bound B   stage 3: bytes of gathered layers at most\n"
          "  --prefetch N       stage 3: layers gathered ahead (default 1)\n"
          "  --save DIR         write a sharded checkpoint after the last step\n"
          "  --resume DIR       continue from the checkpoint in DIR\n"
          "  --layers N         linear layers, 1 to 8 (default 3)\n"
          "  --width N          width of every hidden layer (default 37, 29)\n"
          "  --device D         host (default) or cuda: the MLP and its ZeRO state on the\n"
          "                     rank's GPU (GPU local rank %% GPUs)\n"
          "  --quiet            print the final line only\n");
}

static int parse_dtype(const char *s, weftDataType_t *out) {
  if (strcmp(s, "fp32") == 0) *out = weftFloat32;
  else if (strcmp(s, "bf16") == 0) *out = weftBfloat16;
  else if (strcmp(s, "fp16") == 0) *out = weftFloat16;
  else return -1;
  return 0;
}

int main(int argc, char **argv) {
  struct train_opts o;
  train_opts_defaults(&o);
  o.log = stdout;
  int reduce_set = 0, layers = 0, width = 0;
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
      {"device", required_argument, NULL, 'D'},
      {NULL, 0, NULL, 0}};
  int c;
  while ((c = getopt_long(argc, argv, "h", longopts, NULL)) != -1) {
    switch (c) {
    case 'z': o.stage = atoi(optarg); break;
    case 's': o.steps = atoi(optarg); break;
    case 'S': o.seed = strtoul(optarg, NULL, 10); break;
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
    case 'l': o.lr = atof(optarg); break;
    case 'c': o.clip = atof(optarg); break;
    case 'a': o.accum = atoi(optarg); break;
    case 'b': o.global_batch = atoi(optarg); break;
    case 'g': o.gather_bound = strtoull(optarg, NULL, 10); break;
    case 'p': o.prefetch = atoi(optarg); break;
    case 'w': o.save = optarg; break;
    case 'R': o.resume = optarg; break;
    case 'L': layers = atoi(optarg); break;
    case 'W': width = atoi(optarg); break;
    case 'q': o.log = NULL; break;
    case 'D':
      if (strcmp(optarg, "host") != 0 && strcmp(optarg, "cuda") != 0) {
        fprintf(stderr, "weft-train: --device %s: host or cuda\n", optarg);
        return 2;
      }
      o.device = strcmp(optarg, "cuda") == 0;
      break;
    case 'h': usage(stdout); return 0;
    default: usage(stderr); return 2;
    }
  }
  if (optind < argc || o.stage < 0 || o.stage > 3 || o.steps < 0 || o.accum < 1 ||
      o.global_batch < 1) {
    usage(stderr);
    return 2;
  }
  if (!reduce_set) o.reduce_type = o.dtype;
  if (layers != 0 || width != 0) {
    if (layers == 0) layers = o.nlayers;
    if (layers < 1 || layers > TRAIN_MAX_LAYERS || width < 0) {
      usage(stderr);
      return 2;
    }
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
  int rank;
  weftCommUserRank(comm, &rank);
  struct train_result r;
  weftResult_t res = train_run(comm, &o, &r);
  if (res != weftSuccess) {
    const char *text = weftZeroLastError();
    if (text[0] == '\0') text = weftGetLastError(NULL);
    fprintf(stderr, "weft-train: rank %d: %s%s%s\n", rank, weftGetErrorString(res),
            text[0] != '\0' ? ": " : "", text);
    weftCommAbort(comm);
    return 1;
  }
  if (rank == 0)
    printf("final loss %.17g params-l2 %.17g params-sum %.17g\n", r.final_loss, r.l2, r.sum);
  free(r.params);
  weftCommDestroy(comm);
  return 0;
}
