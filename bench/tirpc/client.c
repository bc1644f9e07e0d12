/* RDMATEST over ONC RPC/TCP with libtirpc: the comparison client of `rpcrdma-bench compare`.
 * Usage: tirpc-client PORT PROC SIZE WARMUP_MS RUN_MS
 *   PROC: null | echo | read | write. One call in flight (ONC RPC clients are synchronous).
 * Checks every reply's data (exit 3 on a mismatch) and writes each call's round trip in nanoseconds
 * (u64, native byte order) to stdout after the run. */
#include "rdmatest.h"
#include <arpa/inet.h>
#include <netinet/in.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

static uint64_t now_ns(void) {
	struct timespec t;
	clock_gettime(CLOCK_MONOTONIC, &t);
	return (uint64_t)t.tv_sec * 1000000000u + (uint64_t)t.tv_nsec;
}

/* Decodes an rt_bytes reply into the caller's buffer, refusing more than `res_cap` bytes. */
static u_int res_cap;
static bool_t xdr_res(XDR *x, rt_bytes *b) { return xdr_bytes(x, &b->rt_bytes_val, &b->rt_bytes_len, res_cap); }

static unsigned char pattern_byte(unsigned seed, unsigned i) { return (unsigned char)(seed + i * 31u + (i >> 8)); }

int main(int argc, char **argv) {
	if (argc != 6) { fprintf(stderr, "usage: tirpc-client PORT PROC SIZE WARMUP_MS RUN_MS\n"); return 2; }
	int port = atoi(argv[1]);
	const char *proc = argv[2];
	unsigned size = (unsigned)strtoul(argv[3], 0, 10);
	uint64_t warm = strtoull(argv[4], 0, 10) * 1000000u, run = strtoull(argv[5], 0, 10) * 1000000u;
	struct sockaddr_in a = { .sin_family = AF_INET, .sin_port = htons((uint16_t)port) };
	a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
	int sock = RPC_ANYSOCK;
	CLIENT *c = clnttcp_create(&a, RDMATEST, RDMATEST_V1, &sock, 0, 0);
	if (!c) { clnt_pcreateerror("tirpc-client"); return 1; }
	struct timeval tmo = { 10, 0 };
	unsigned char *pat[4], *res = malloc(size + 1);
	res_cap = size;
	for (unsigned s = 0; s < 4; s++) {
		pat[s] = malloc(size + 1);
		for (unsigned i = 0; i < size; i++) pat[s][i] = pattern_byte(s + 1, i);
	}
	size_t cap = 1 << 16, n = 0;
	uint64_t *lat = malloc(cap * sizeof *lat);
	if (!res || !lat) return 1;
	uint64_t start = now_ns();
	for (uint64_t k = 0;; k++) {
		unsigned seed = (unsigned)(k % 4) + 1;
		unsigned char *d = pat[k % 4];
		rt_bytes out = { size, (char *)res }; /* decoded into our buffer (at most size bytes): no allocation per call */
		enum clnt_stat st;
		int ok = 1;
		uint64_t t0 = now_ns();
		if (!strcmp(proc, "null")) {
			st = clnt_call(c, RT_NULL, (xdrproc_t)xdr_void, NULL, (xdrproc_t)xdr_void, NULL, tmo);
		} else if (!strcmp(proc, "echo")) {
			rt_bytes in = { size, (char *)d };
			st = clnt_call(c, RT_ECHO, (xdrproc_t)xdr_rt_bytes, (caddr_t)&in, (xdrproc_t)xdr_res, (caddr_t)&out, tmo);
			ok = out.rt_bytes_len == size && !memcmp(out.rt_bytes_val, d, size);
		} else if (!strcmp(proc, "read")) {
			read_args in = { size, seed };
			st = clnt_call(c, RT_READ, (xdrproc_t)xdr_read_args, (caddr_t)&in, (xdrproc_t)xdr_res, (caddr_t)&out, tmo);
			ok = out.rt_bytes_len == size && !memcmp(out.rt_bytes_val, d, size);
		} else if (!strcmp(proc, "write")) {
			write_args in = { seed, { size, (char *)d } };
			u_int r = 0;
			st = clnt_call(c, RT_WRITE, (xdrproc_t)xdr_write_args, (caddr_t)&in, (xdrproc_t)xdr_u_int, (caddr_t)&r, tmo);
			ok = r == size;
		} else {
			fprintf(stderr, "tirpc-client: unknown procedure %s\n", proc);
			return 2;
		}
		uint64_t t1 = now_ns();
		if (st != RPC_SUCCESS) { clnt_perror(c, "tirpc-client"); return 1; }
		if (!ok) { fprintf(stderr, "tirpc-client: call %llu: reply data differs\n", (unsigned long long)k); return 3; }
		if (t1 - start < warm) continue;
		if (t1 - start >= warm + run) break;
		if (n == cap) {
			cap *= 2;
			lat = realloc(lat, cap * sizeof *lat);
			if (!lat) return 1;
		}
		lat[n++] = t1 - t0;
	}
	fwrite(lat, sizeof *lat, n, stdout);
	clnt_destroy(c);
	return 0;
}
