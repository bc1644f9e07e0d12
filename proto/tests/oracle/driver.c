/*
 * Oracle driver for tests/oracle.rs: the rpcgen-generated XDR codec of rpcrdma1.x.
 *
 *   driver decode        reads hex lines on stdin; for each, decodes an rdma_msg that must
 *                        consume every byte, then prints "F <fields>" and "H <hex>" of its
 *                        own re-encoding (or "X" if the decode fails).
 *   driver gen N SEED    builds N random valid headers (and some RDMA_MSGP / RDMA_DONE),
 *                        encodes them and prints "F <fields>" and "H <hex>" for each.
 *
 * Field line: xid vers credit proc, then for MSG/NOMSG "R n (pos h len off)..."
 * "W k (m (h len off)...)..." "P 0|1 [m (h len off)...]", for MSGP "A align thresh" first,
 * for ERROR "E 1 low high" or "E 2".
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <inttypes.h>
#include <rpc/rpc.h>
#include "rpcrdma1.h"

#define BUF 65536

static uint64_t rng;

static uint64_t next(void)
{
	/* xorshift64* */
	rng ^= rng >> 12;
	rng ^= rng << 25;
	rng ^= rng >> 27;
	return rng * 2685821657736338717ULL;
}

static uint32_t below(uint32_t n) { return (uint32_t)(next() % n); }

static void print_seg(const xdr_rdma_segment *s)
{
	printf(" %u %u %" PRIu64, s->handle, s->length, (uint64_t)s->offset);
}

static void print_chunk(const xdr_write_chunk *c)
{
	printf(" %u", c->target.target_len);
	for (u_int i = 0; i < c->target.target_len; i++)
		print_seg(&c->target.target_val[i]);
}

static void print_lists(xdr_read_list *r, xdr_write_list *w, xdr_write_chunk *p)
{
	int n = 0;
	for (xdr_read_list *e = r; e; e = e->next)
		n++;
	printf(" R %d", n);
	for (xdr_read_list *e = r; e; e = e->next) {
		printf(" %u", e->entry.position);
		print_seg(&e->entry.target);
	}
	n = 0;
	for (xdr_write_list *e = w; e; e = e->next)
		n++;
	printf(" W %d", n);
	for (xdr_write_list *e = w; e; e = e->next)
		print_chunk(&e->entry);
	if (p) {
		printf(" P 1");
		print_chunk(p);
	} else {
		printf(" P 0");
	}
}

static void print_fields(const rdma_msg *m)
{
	const rdma_body *b = &m->rdma_body;
	printf("F %u %u %u %d", m->rdma_xid, m->rdma_vers, m->rdma_credit, (int)b->proc);
	switch (b->proc) {
	case RDMA_MSG:
		print_lists(b->rdma_body_u.rdma_msg.rdma_reads, b->rdma_body_u.rdma_msg.rdma_writes,
			    b->rdma_body_u.rdma_msg.rdma_reply);
		break;
	case RDMA_NOMSG:
		print_lists(b->rdma_body_u.rdma_nomsg.rdma_reads,
			    b->rdma_body_u.rdma_nomsg.rdma_writes,
			    b->rdma_body_u.rdma_nomsg.rdma_reply);
		break;
	case RDMA_MSGP:
		printf(" A %u %u", b->rdma_body_u.rdma_msgp.rdma_align,
		       b->rdma_body_u.rdma_msgp.rdma_thresh);
		print_lists(b->rdma_body_u.rdma_msgp.rdma_reads,
			    b->rdma_body_u.rdma_msgp.rdma_writes,
			    b->rdma_body_u.rdma_msgp.rdma_reply);
		break;
	case RDMA_DONE:
		break;
	case RDMA_ERROR:
		if (b->rdma_body_u.rdma_error.err == ERR_VERS)
			printf(" E 1 %u %u",
			       b->rdma_body_u.rdma_error.rpc_rdma_error_u.range.rdma_vers_low,
			       b->rdma_body_u.rdma_error.rpc_rdma_error_u.range.rdma_vers_high);
		else
			printf(" E 2");
		break;
	}
	printf("\n");
}

static int encode_and_print(rdma_msg *m)
{
	static char out[BUF];
	XDR x;
	xdrmem_create(&x, out, BUF, XDR_ENCODE);
	if (!xdr_rdma_msg(&x, m))
		return -1;
	u_int n = xdr_getpos(&x);
	printf("H ");
	for (u_int i = 0; i < n; i++)
		printf("%02x", (unsigned char)out[i]);
	printf("\n");
	xdr_destroy(&x);
	return 0;
}

static int hexval(int c)
{
	if (c >= '0' && c <= '9')
		return c - '0';
	if (c >= 'a' && c <= 'f')
		return c - 'a' + 10;
	return -1;
}

static int decode_mode(void)
{
	static char line[2 * BUF + 2];
	static char bytes[BUF];
	while (fgets(line, sizeof line, stdin)) {
		size_t len = strcspn(line, "\r\n");
		if (len % 2 || len / 2 > BUF)
			return 2;
		for (size_t i = 0; i < len / 2; i++) {
			int hi = hexval(line[2 * i]), lo = hexval(line[2 * i + 1]);
			if (hi < 0 || lo < 0)
				return 2;
			bytes[i] = (char)(hi << 4 | lo);
		}
		rdma_msg m;
		memset(&m, 0, sizeof m);
		XDR x;
		xdrmem_create(&x, bytes, (u_int)(len / 2), XDR_DECODE);
		if (!xdr_rdma_msg(&x, &m) || xdr_getpos(&x) != len / 2) {
			printf("X\n");
		} else {
			print_fields(&m);
			if (encode_and_print(&m))
				return 3;
		}
		xdr_destroy(&x);
		xdr_free((xdrproc_t)xdr_rdma_msg, (char *)&m);
	}
	return 0;
}

static void random_seg(xdr_rdma_segment *s, uint32_t maxlen)
{
	s->handle = (uint32_t)next();
	s->length = below(maxlen);
	s->offset = next() >> 1;
}

static xdr_write_chunk *random_chunk(xdr_write_chunk *c)
{
	c->target.target_len = below(4);
	c->target.target_val = calloc(c->target.target_len + 1, sizeof(xdr_rdma_segment));
	for (u_int i = 0; i < c->target.target_len; i++)
		random_seg(&c->target.target_val[i], 1u << 20);
	return c;
}

static void random_lists(xdr_read_list **r, xdr_write_list **w, xdr_write_chunk **p, int pzrc)
{
	xdr_read_list **tail = r;
	uint32_t pos = 4 * (1 + below(8));
	if (pzrc && below(2)) {
		int n = 1 + below(3);
		for (int i = 0; i < n; i++) {
			xdr_read_list *e = calloc(1, sizeof *e);
			e->entry.position = 0;
			random_seg(&e->entry.target, 1u << 16);
			*tail = e;
			tail = &e->next;
		}
	}
	int chunks = below(3);
	for (int c = 0; c < chunks; c++) {
		int n = 1 + below(3);
		uint32_t total = 0;
		for (int i = 0; i < n; i++) {
			xdr_read_list *e = calloc(1, sizeof *e);
			e->entry.position = pos;
			random_seg(&e->entry.target, 1u << 16);
			total += e->entry.target.length;
			*tail = e;
			tail = &e->next;
		}
		pos = ((pos + total + 3) & ~3u) + 4 * below(4);
	}
	*tail = NULL;
	xdr_write_list **wt = w;
	int wn = below(3);
	for (int i = 0; i < wn; i++) {
		xdr_write_list *e = calloc(1, sizeof *e);
		random_chunk(&e->entry);
		*wt = e;
		wt = &e->next;
	}
	*wt = NULL;
	*p = below(2) ? random_chunk(calloc(1, sizeof **p)) : NULL;
}

static int gen_mode(long n)
{
	for (long i = 0; i < n; i++) {
		rdma_msg m;
		memset(&m, 0, sizeof m);
		m.rdma_xid = (uint32_t)next();
		m.rdma_vers = 1;
		m.rdma_credit = below(256);
		rdma_body *b = &m.rdma_body;
		uint32_t kind = below(20);
		if (kind < 8) {
			b->proc = RDMA_MSG;
			random_lists(&b->rdma_body_u.rdma_msg.rdma_reads,
				     &b->rdma_body_u.rdma_msg.rdma_writes,
				     &b->rdma_body_u.rdma_msg.rdma_reply, 0);
		} else if (kind < 15) {
			struct rpc_rdma_header_nomsg *h = &b->rdma_body_u.rdma_nomsg;
			b->proc = RDMA_NOMSG;
			do
				random_lists(&h->rdma_reads, &h->rdma_writes, &h->rdma_reply, 1);
			while (!h->rdma_reads && !h->rdma_writes && !h->rdma_reply);
		} else if (kind < 16) {
			b->proc = RDMA_MSGP;
			b->rdma_body_u.rdma_msgp.rdma_align = below(4096);
			b->rdma_body_u.rdma_msgp.rdma_thresh = below(4096);
			random_lists(&b->rdma_body_u.rdma_msgp.rdma_reads,
				     &b->rdma_body_u.rdma_msgp.rdma_writes,
				     &b->rdma_body_u.rdma_msgp.rdma_reply, 0);
		} else if (kind < 17) {
			b->proc = RDMA_DONE;
		} else if (kind < 19) {
			b->proc = RDMA_ERROR;
			b->rdma_body_u.rdma_error.err = ERR_VERS;
			b->rdma_body_u.rdma_error.rpc_rdma_error_u.range.rdma_vers_low = below(3);
			b->rdma_body_u.rdma_error.rpc_rdma_error_u.range.rdma_vers_high = below(3);
		} else {
			b->proc = RDMA_ERROR;
			b->rdma_body_u.rdma_error.err = ERR_CHUNK;
		}
		print_fields(&m);
		if (encode_and_print(&m))
			return 3;
		xdr_free((xdrproc_t)xdr_rdma_msg, (char *)&m);
	}
	return 0;
}

int main(int argc, char **argv)
{
	if (argc == 2 && !strcmp(argv[1], "decode"))
		return decode_mode();
	if (argc == 4 && !strcmp(argv[1], "gen")) {
		rng = strtoull(argv[3], NULL, 10) | 1;
		return gen_mode(strtol(argv[2], NULL, 10));
	}
	fprintf(stderr, "usage: driver decode | driver gen N SEED\n");
	return 1;
}
