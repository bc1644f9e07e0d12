/* Oracle driver: rpcgen's codec for nfs3.x (RFC 1813 subset).
 *   driver enc CASE SEED  -> line 1: hex of the XDR encoding of a value derived from SEED;
 *                            line 2: the value's fields in the test's canonical text form.
 *   driver dec CASE HEX   -> decodes HEX as CASE's argument type and prints its fields (or "ERR"). */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <rpc/rpc.h>
#include "nfs3.h"

static unsigned long long st;
static unsigned rnd(void) { st = st * 6364136223846793005ULL + 1442695040888963407ULL; return (unsigned)(st >> 33); }
static unsigned long long rnd64(void) { return ((unsigned long long)rnd() << 32) ^ rnd() ^ ((unsigned long long)rnd() << 1); }

static char bufs[64][300];
static int nb;
static char *bytes(unsigned n) { char *b = bufs[nb++ % 64]; for (unsigned i = 0; i < n; i++) b[i] = 'a' + rnd() % 26; b[n] = 0; return b; }

static void fill_fattr(fattr3 *a) {
    a->type = 1 + rnd() % 7; a->mode = rnd(); a->nlink = rnd(); a->uid = rnd(); a->gid = rnd();
    a->size = rnd64(); a->used = rnd64(); a->rdev.specdata1 = rnd(); a->rdev.specdata2 = rnd();
    a->fsid = rnd64(); a->fileid = rnd64();
    a->atime.seconds = rnd(); a->atime.nseconds = rnd(); a->mtime.seconds = rnd(); a->mtime.nseconds = rnd();
    a->ctime.seconds = rnd(); a->ctime.nseconds = rnd();
}
static void fill_poa(post_op_attr *p) { p->attributes_follow = rnd() % 2; if (p->attributes_follow) fill_fattr(&p->post_op_attr_u.attributes); }
static void fill_fh(nfs_fh3 *f) { f->data.data_len = rnd() % 65; f->data.data_val = bytes(f->data.data_len); }

static void p_fattr(const fattr3 *a) {
    printf(" A %u %u %u %u %u %llu %llu %u %u %llu %llu %u %u %u %u %u %u", a->type, a->mode, a->nlink, a->uid, a->gid,
           (unsigned long long)a->size, (unsigned long long)a->used, a->rdev.specdata1, a->rdev.specdata2,
           (unsigned long long)a->fsid, (unsigned long long)a->fileid, a->atime.seconds, a->atime.nseconds,
           a->mtime.seconds, a->mtime.nseconds, a->ctime.seconds, a->ctime.nseconds);
}
static void p_poa(const post_op_attr *p) { if (p->attributes_follow) p_fattr(&p->post_op_attr_u.attributes); else printf(" -"); }
static void p_hex(const char *d, unsigned n) { printf(" "); if (!n) printf("."); for (unsigned i = 0; i < n; i++) printf("%02x", (unsigned char)d[i]); }

static char out[1 << 20];

int main(int argc, char **argv) {
    if (argc != 4) return 2;
    const char *c = argv[2];
    XDR x;
    if (!strcmp(argv[1], "enc")) {
        st = strtoull(argv[3], 0, 10) * 7919 + 17;
        xdrmem_create(&x, out, sizeof out, XDR_ENCODE);
        int ok = 0;
        /* The field line is printed after the hex line, so collect it with a second pass of printing. */
        if (!strcmp(c, "getattr")) {
            GETATTR3res r; memset(&r, 0, sizeof r); r.status = rnd() % 3 ? NFS3_OK : NFS3ERR_STALE;
            if (r.status == NFS3_OK) fill_fattr(&r.GETATTR3res_u.resok.obj_attributes);
            ok = xdr_GETATTR3res(&x, &r); p_hex(out, xdr_getpos(&x)); printf("\n%u", r.status);
            if (r.status == NFS3_OK) p_fattr(&r.GETATTR3res_u.resok.obj_attributes);
        } else if (!strcmp(c, "lookup")) {
            LOOKUP3res r; memset(&r, 0, sizeof r); r.status = rnd() % 3 ? NFS3_OK : NFS3ERR_NOENT;
            if (r.status == NFS3_OK) { fill_fh(&r.LOOKUP3res_u.resok.object); fill_poa(&r.LOOKUP3res_u.resok.obj_attributes); fill_poa(&r.LOOKUP3res_u.resok.dir_attributes); }
            else fill_poa(&r.LOOKUP3res_u.resfail.dir_attributes);
            ok = xdr_LOOKUP3res(&x, &r); p_hex(out, xdr_getpos(&x)); printf("\n%u", r.status);
            if (r.status == NFS3_OK) { p_hex(r.LOOKUP3res_u.resok.object.data.data_val, r.LOOKUP3res_u.resok.object.data.data_len); p_poa(&r.LOOKUP3res_u.resok.obj_attributes); p_poa(&r.LOOKUP3res_u.resok.dir_attributes); }
            else p_poa(&r.LOOKUP3res_u.resfail.dir_attributes);
        } else if (!strcmp(c, "read")) {
            READ3res r; memset(&r, 0, sizeof r); r.status = rnd() % 3 ? NFS3_OK : NFS3ERR_IO;
            if (r.status == NFS3_OK) { READ3resok *k = &r.READ3res_u.resok; fill_poa(&k->file_attributes); k->data.data_len = rnd() % 200; k->data.data_val = bytes(k->data.data_len); k->count = k->data.data_len; k->eof = rnd() % 2; }
            else fill_poa(&r.READ3res_u.resfail.file_attributes);
            ok = xdr_READ3res(&x, &r); p_hex(out, xdr_getpos(&x)); printf("\n%u", r.status);
            if (r.status == NFS3_OK) { READ3resok *k = &r.READ3res_u.resok; p_poa(&k->file_attributes); printf(" %u %d", k->count, k->eof); p_hex(k->data.data_val, k->data.data_len); }
            else p_poa(&r.READ3res_u.resfail.file_attributes);
        } else if (!strcmp(c, "write")) {
            WRITE3res r; memset(&r, 0, sizeof r); r.status = rnd() % 3 ? NFS3_OK : NFS3ERR_ACCES;
            wcc_data *w = r.status == NFS3_OK ? &r.WRITE3res_u.resok.file_wcc : &r.WRITE3res_u.resfail.file_wcc;
            w->before.attributes_follow = rnd() % 2;
            if (w->before.attributes_follow) { wcc_attr *b = &w->before.pre_op_attr_u.attributes; b->size = rnd64(); b->mtime.seconds = rnd(); b->mtime.nseconds = rnd(); b->ctime.seconds = rnd(); b->ctime.nseconds = rnd(); }
            fill_poa(&w->after);
            if (r.status == NFS3_OK) { WRITE3resok *k = &r.WRITE3res_u.resok; k->count = rnd(); k->committed = rnd() % 3; memcpy(k->verf, bytes(8), 8); }
            ok = xdr_WRITE3res(&x, &r); p_hex(out, xdr_getpos(&x)); printf("\n%u", r.status);
            if (w->before.attributes_follow) { wcc_attr *b = &w->before.pre_op_attr_u.attributes; printf(" B %llu %u %u %u %u", (unsigned long long)b->size, b->mtime.seconds, b->mtime.nseconds, b->ctime.seconds, b->ctime.nseconds); } else printf(" -");
            p_poa(&w->after);
            if (r.status == NFS3_OK) { WRITE3resok *k = &r.WRITE3res_u.resok; printf(" %u %u", k->count, k->committed); p_hex(k->verf, 8); }
        } else if (!strcmp(c, "rdp")) {
            READDIRPLUS3res r; memset(&r, 0, sizeof r); r.status = rnd() % 4 ? NFS3_OK : NFS3ERR_STALE;
            static entryplus3 e[20];
            if (r.status == NFS3_OK) {
                READDIRPLUS3resok *k = &r.READDIRPLUS3res_u.resok; fill_poa(&k->dir_attributes); memcpy(k->cookieverf, bytes(8), 8);
                unsigned n = rnd() % 20; k->reply.entries = n ? &e[0] : NULL; k->reply.eof = rnd() % 2;
                for (unsigned i = 0; i < n; i++) {
                    e[i].fileid = rnd64(); e[i].name = bytes(1 + rnd() % 255); e[i].cookie = rnd64(); fill_poa(&e[i].name_attributes);
                    e[i].name_handle.handle_follows = rnd() % 2; if (e[i].name_handle.handle_follows) fill_fh(&e[i].name_handle.post_op_fh3_u.handle);
                    e[i].nextentry = i + 1 < n ? &e[i + 1] : NULL;
                }
            } else fill_poa(&r.READDIRPLUS3res_u.resfail.dir_attributes);
            ok = xdr_READDIRPLUS3res(&x, &r); p_hex(out, xdr_getpos(&x)); printf("\n%u", r.status);
            if (r.status == NFS3_OK) {
                READDIRPLUS3resok *k = &r.READDIRPLUS3res_u.resok; p_poa(&k->dir_attributes); p_hex(k->cookieverf, 8);
                for (entryplus3 *p = k->reply.entries; p; p = p->nextentry) {
                    printf(" E %llu %s %llu", (unsigned long long)p->fileid, p->name, (unsigned long long)p->cookie); p_poa(&p->name_attributes);
                    if (p->name_handle.handle_follows) p_hex(p->name_handle.post_op_fh3_u.handle.data.data_val, p->name_handle.post_op_fh3_u.handle.data.data_len); else printf(" -");
                }
                printf(" eof %d", k->reply.eof);
            } else p_poa(&r.READDIRPLUS3res_u.resfail.dir_attributes);
        } else if (!strcmp(c, "mnt")) {
            mountres3 r; memset(&r, 0, sizeof r); r.fhs_status = rnd() % 3 ? MNT3_OK : MNT3ERR_ACCES;
            static int fl[8];
            if (r.fhs_status == MNT3_OK) { mountres3_ok *k = &r.mountres3_u.mountinfo; k->fhandle.fhandle3_len = rnd() % 65; k->fhandle.fhandle3_val = bytes(k->fhandle.fhandle3_len);
                k->auth_flavors.auth_flavors_len = rnd() % 8; k->auth_flavors.auth_flavors_val = fl; for (int i = 0; i < 8; i++) fl[i] = rnd() % 400000; }
            ok = xdr_mountres3(&x, &r); p_hex(out, xdr_getpos(&x)); printf("\n%u", r.fhs_status);
            if (r.fhs_status == MNT3_OK) { mountres3_ok *k = &r.mountres3_u.mountinfo; p_hex(k->fhandle.fhandle3_val, k->fhandle.fhandle3_len);
                for (unsigned i = 0; i < k->auth_flavors.auth_flavors_len; i++) printf(" %d", fl[i]); }
        } else return 2;
        printf("\n");
        return ok ? 0 : 1;
    }
    /* dec */
    static char in[1 << 20];
    size_t n = strlen(argv[3]) / 2;
    for (size_t i = 0; i < n; i++) { unsigned v; sscanf(argv[3] + 2 * i, "%2x", &v); in[i] = (char)v; }
    xdrmem_create(&x, in, n, XDR_DECODE);
    if (!strcmp(c, "getattr")) { GETATTR3args a; memset(&a, 0, sizeof a); if (!xdr_GETATTR3args(&x, &a)) { puts("ERR"); return 0; } p_hex(a.object.data.data_val, a.object.data.data_len); }
    else if (!strcmp(c, "lookup")) { LOOKUP3args a; memset(&a, 0, sizeof a); if (!xdr_LOOKUP3args(&x, &a)) { puts("ERR"); return 0; } p_hex(a.what.dir.data.data_val, a.what.dir.data.data_len); printf(" %s", a.what.name); }
    else if (!strcmp(c, "read")) { READ3args a; memset(&a, 0, sizeof a); if (!xdr_READ3args(&x, &a)) { puts("ERR"); return 0; } p_hex(a.file.data.data_val, a.file.data.data_len); printf(" %llu %u", (unsigned long long)a.offset, a.count); }
    else if (!strcmp(c, "write")) { WRITE3args a; memset(&a, 0, sizeof a); if (!xdr_WRITE3args(&x, &a)) { puts("ERR"); return 0; } p_hex(a.file.data.data_val, a.file.data.data_len); printf(" %llu %u %u", (unsigned long long)a.offset, a.count, a.stable); p_hex(a.data.data_val, a.data.data_len); }
    else if (!strcmp(c, "rdp")) { READDIRPLUS3args a; memset(&a, 0, sizeof a); if (!xdr_READDIRPLUS3args(&x, &a)) { puts("ERR"); return 0; } p_hex(a.dir.data.data_val, a.dir.data.data_len); printf(" %llu", (unsigned long long)a.cookie); p_hex(a.cookieverf, 8); printf(" %u %u", a.dircount, a.maxcount); }
    else return 2;
    printf(" rest %u\n", (unsigned)(n - xdr_getpos(&x)));
    return 0;
}
