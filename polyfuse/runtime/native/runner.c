// Runs a polyfuse program entry point on tensors passed through files; linked with the
// program's object for a CPU this process cannot run (aarch64 on x86, under qemu):
//
//     runner WEIGHTS IO
//
// WEIGHTS is the program's constants blob. IO holds, as little-endian uint64: a magic
// number, the number of inputs, of outputs, the activation arena's bytes, each input's
// and each output's bytes; then the inputs' bytes one after another (with the magic
// number IO_SEEDED, the outputs' initial bytes follow: outputs given with out=). The runner writes
// IO.out: the entry point's int64 status, then the outputs' bytes. Exit status 0 means
// IO.out was written; any other status comes with a message on stderr.

#define _POSIX_C_SOURCE 200112L
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define IO_MAGIC 0x31304f4946594c50ull   // "PLYFIO01"
#define IO_SEEDED 0x32304f4946594c50ull  // "PLYFIO02": the outputs' initial contents follow
#define ALIGNMENT 64

int polyfuse_entry(const uint8_t *weights, uint8_t *activations, const void *const *inputs,
                   void *const *outputs);

static void *aligned_buffer(uint64_t bytes) {
    void *p = NULL;
    if (posix_memalign(&p, ALIGNMENT, bytes ? bytes : ALIGNMENT) != 0) {
        fprintf(stderr, "runner: cannot allocate %llu bytes\n", (unsigned long long)bytes);
        exit(3);
    }
    return p;
}

static void read_exactly(FILE *f, void *dst, uint64_t bytes, const char *what) {
    if (bytes && fread(dst, 1, bytes, f) != bytes) {
        fprintf(stderr, "runner: %s is truncated\n", what);
        exit(2);
    }
}

int main(int argc, char **argv) {
    if (argc != 3) {
        fprintf(stderr, "usage: %s WEIGHTS IO\n", argv[0]);
        return 2;
    }
    FILE *wf = fopen(argv[1], "rb"), *io = fopen(argv[2], "rb");
    if (!wf || !io) {
        fprintf(stderr, "runner: cannot open %s\n", wf ? argv[2] : argv[1]);
        return 2;
    }
    fseek(wf, 0, SEEK_END);
    long wbytes = ftell(wf);
    fseek(wf, 0, SEEK_SET);
    uint8_t *weights = aligned_buffer((uint64_t)wbytes);
    read_exactly(wf, weights, (uint64_t)wbytes, "the weights file");
    fclose(wf);

    uint64_t head[4];
    read_exactly(io, head, sizeof head, "the IO file");
    if (head[0] != IO_MAGIC && head[0] != IO_SEEDED) {
        fprintf(stderr, "runner: %s is not a polyfuse IO file\n", argv[2]);
        return 2;
    }
    uint64_t n_in = head[1], n_out = head[2];
    uint64_t *sizes = malloc((n_in + n_out + 1) * sizeof *sizes);
    void **buffers = malloc((n_in + n_out + 1) * sizeof *buffers);
    read_exactly(io, sizes, (n_in + n_out) * sizeof *sizes, "the IO file");
    for (uint64_t k = 0; k < n_in + n_out; ++k) {
        buffers[k] = aligned_buffer(sizes[k]);
        if (k < n_in || head[0] == IO_SEEDED) read_exactly(io, buffers[k], sizes[k], "the IO file");
    }
    fclose(io);
    uint8_t *activations = aligned_buffer(head[3]);

    int64_t status = polyfuse_entry(weights, activations, (const void *const *)buffers,
                                    buffers + n_in);

    size_t len = strlen(argv[2]);
    char *out_path = malloc(len + 5);
    memcpy(out_path, argv[2], len);
    memcpy(out_path + len, ".out", 5);
    FILE *out = fopen(out_path, "wb");
    if (!out || fwrite(&status, sizeof status, 1, out) != 1) {
        fprintf(stderr, "runner: cannot write %s\n", out_path);
        return 2;
    }
    for (uint64_t k = n_in; k < n_in + n_out; ++k)
        if (sizes[k] && fwrite(buffers[k], 1, sizes[k], out) != sizes[k]) {
            fprintf(stderr, "runner: cannot write %s\n", out_path);
            return 2;
        }
    return fclose(out) == 0 ? 0 : 2;
}
