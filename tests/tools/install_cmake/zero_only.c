/* A program that calls weft_zero.h's functions only (tests/tools/test_install.sh):
 * linked with --as-needed it names libweft_zero.so alone, which must find
 * libweft.so itself. Exits 0 when the shard and the conversions hold. */
#include <stdio.h>
#include <string.h>
#include <weft_zero.h>

int main(void) {
  weftZeroShard_t s = weftZeroShardOf(10, 4, 3);
  if (s.offset != 9 || s.count != 1) return 1;
  float in[3] = {1, 2, 3}, out[3];
  unsigned short half[3];
  if (weftZeroFromFloat(in, weftBfloat16, half, 3) != weftSuccess) return 2;
  if (weftZeroToFloat(half, weftBfloat16, out, 3) != weftSuccess) return 3;
  if (memcmp(in, out, sizeof in) != 0) return 4;
  printf("zero_only: ok\n");
  return 0;
}
