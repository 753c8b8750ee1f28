// Random byte mutations of one HDF5 file, each opened with libhdf5 and asked what
// io::check_format asks (H5Fopen, H5Gopen2 "/", H5Aexists and H5Aopen of the root attributes),
// built with AddressSanitizer against Debian's uninstrumented libhdf5 (its memcpy calls are
// checked). Found the libhdf5 1.10.8 overflow of issue 39 item 24 without the clang fuzz build;
// the input that triggers a report is left at $TMPDIR/hdf5_attr_mutate-<pid>.h5.
//   gcc -O1 -g -fsanitize=address -I/usr/include/hdf5/serial tests/fuzz/hdf5_attr_mutate.c \
//       -L/usr/lib/x86_64-linux-gnu/hdf5/serial -lhdf5 -o /tmp/hdf5_attr_mutate
//   ASAN_OPTIONS=allocator_may_return_null=1:detect_leaks=0 /tmp/hdf5_attr_mutate SEED_FILE RUNS RNG_SEED
#include <hdf5.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

static unsigned long long rng = 88172645463325252ull;

static unsigned long long next(void) {
  rng ^= rng << 13;
  rng ^= rng >> 7;
  rng ^= rng << 17;
  return rng;
}

// 1 to 8 bytes flipped by one bit, replaced at random or set to an edge value.
static void mutate(unsigned char* buf, size_t n) {
  static const unsigned char edges[] = {0, 0xff, 0x7f, 0x80, 1};
  const int count = 1 + (int)(next() % 8);
  for (int i = 0; i < count; ++i) {
    const size_t pos = next() % n;
    switch (next() % 3) {
      case 0: buf[pos] ^= (unsigned char)(1u << (next() % 8)); break;
      case 1: buf[pos] = (unsigned char)next(); break;
      default: buf[pos] = edges[next() % sizeof edges]; break;
    }
  }
}

static void probe(const char* path) {
  static const char* const names[] = {"format", "format_version", "qforge_version"};
  const hid_t file = H5Fopen(path, H5F_ACC_RDONLY, H5P_DEFAULT);
  if (file < 0) return;
  const hid_t root = H5Gopen2(file, "/", H5P_DEFAULT);
  for (int i = 0; root >= 0 && i < 3; ++i) {
    if (H5Aexists(root, names[i]) <= 0) continue;
    const hid_t a = H5Aopen(root, names[i], H5P_DEFAULT);
    if (a >= 0) H5Aclose(a);
  }
  if (root >= 0) H5Gclose(root);
  H5Fclose(file);
}

int main(int argc, char** argv) {
  static unsigned char seed[1 << 20], buf[1 << 20];
  if (argc != 4) return fprintf(stderr, "usage: %s SEED_FILE RUNS RNG_SEED\n", argv[0]), 2;
  FILE* f = fopen(argv[1], "rb");
  if (!f) return perror(argv[1]), 2;
  const size_t n = fread(seed, 1, sizeof seed, f);
  fclose(f);
  const long runs = atol(argv[2]);
  rng ^= (unsigned long long)atol(argv[3]);
  H5Eset_auto2(H5E_DEFAULT, NULL, NULL);
  const char* tmp = getenv("TMPDIR");
  char path[4096];
  snprintf(path, sizeof path, "%s/hdf5_attr_mutate-%d.h5", tmp && *tmp ? tmp : "/tmp", (int)getpid());
  for (long r = 0; r < runs && n > 0; ++r) {
    memcpy(buf, seed, n);
    mutate(buf, n);
    FILE* o = fopen(path, "wb");
    if (!o || fwrite(buf, 1, n, o) != n) return perror(path), 2;
    fclose(o);
    probe(path);
  }
  unlink(path);
  return 0;
}
