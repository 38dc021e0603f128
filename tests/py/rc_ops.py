#!/usr/bin/python3
# SPDX-License-Identifier: MIT
"""rc_ops.py - RC SEND, WRITE and READ between two processes, in pyverbs.

    rc_ops.py server PORT          wait for a client on TCP PORT
    rc_ops.py client HOST PORT     connect, run the operations, check them

The two sides exchange their QP number, GID, buffer address and rkey over
TCP (as ibv_rc_pingpong does), bring an RC QP each to RTS, and then:
  1. the client SENDs a message the server receives (and checks);
  2. the client WRITEs a pattern into the server's MR; the server checks it
     byte for byte when told over TCP, with no verbs call of its own;
  3. the client READs a pattern the server wrote into its MR, and checks it.
Each side prints one "ok ..." line per check, or "FAIL ..." and exits 1.
"""
import json
import socket
import sys

import pyverbs.device as d
import pyverbs.enums as e
from pyverbs.addr import GID, AHAttr, GlobalRoute
from pyverbs.cq import CQ
from pyverbs.mr import MR
from pyverbs.pd import PD
from pyverbs.qp import QP, QPAttr, QPCap, QPInitAttr
from pyverbs.wr import SGE, RecvWR, SendWR

SIZE = 1 << 20
ACCESS = (e.IBV_ACCESS_LOCAL_WRITE | e.IBV_ACCESS_REMOTE_WRITE |
          e.IBV_ACCESS_REMOTE_READ)


def fail(msg):
    print('FAIL ' + msg, flush=True)
    sys.exit(1)


def pattern(seed):
    return bytes((i * 31 + seed) & 0xff for i in range(SIZE))


def poll(cq, what):
    for _ in range(2000000):
        n, wcs = cq.poll()
        if n:
            if wcs[0].status != e.IBV_WC_SUCCESS:
                fail(f'{what}: completion status {wcs[0].status}'
                     f' (vendor_err {wcs[0].vendor_err})')
            return wcs[0]
    fail(f'{what}: no completion')


class Side:
    def __init__(self):
        names = [dev.name.decode() for dev in d.get_device_list()]
        if not names:
            fail('no RDMA device')
        self.ctx = d.Context(name=names[0])
        self.pd = PD(self.ctx)
        self.cq = CQ(self.ctx, 16)
        self.mr = MR(self.pd, SIZE, ACCESS)
        cap = QPCap(max_send_wr=8, max_recv_wr=8, max_send_sge=1,
                    max_recv_sge=1)
        # pyverbs takes the QP to INIT here, with these access rights
        init = QPAttr(port_num=1)
        init.qp_access_flags = ACCESS
        self.qp = QP(self.pd, QPInitAttr(qp_type=e.IBV_QPT_RC, scq=self.cq,
                                         rcq=self.cq, cap=cap), init)
        self.gid = self.ctx.query_gid(1, 0)

    def info(self):
        return {'qpn': self.qp.qp_num, 'gid': str(self.gid),
                'addr': self.mr.buf, 'rkey': self.mr.rkey}

    def connect(self, peer):
        attr = QPAttr(port_num=1)
        attr.path_mtu = e.IBV_MTU_1024
        attr.max_dest_rd_atomic = 1
        attr.max_rd_atomic = 1
        attr.min_rnr_timer = 12
        attr.rnr_retry = 7
        attr.retry_cnt = 7
        attr.timeout = 14
        attr.dest_qp_num = peer['qpn']
        attr.rq_psn = 0
        attr.sq_psn = 0
        gid = GID(peer["gid"])
        attr.ah_attr = AHAttr(port_num=1, is_global=1,
                              gr=GlobalRoute(dgid=gid, sgid_index=0))
        self.qp.to_rts(attr)


def exchange(sock, mine):
    sock.sendall((json.dumps(mine) + '\n').encode())
    line = sock.makefile().readline()
    if not line:
        fail('peer closed the connection')
    return json.loads(line)


def server(port):
    side = Side()
    lsock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    lsock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    lsock.bind(('0.0.0.0', port))
    lsock.listen(1)
    print('listening', flush=True)
    sock, _ = lsock.accept()
    peer = exchange(sock, side.info())
    side.connect(peer)
    side.qp.post_recv(RecvWR(wr_id=1, num_sge=1,
                             sg=[SGE(side.mr.buf, SIZE, side.mr.lkey)]))
    side.mr.write(pattern(7), SIZE)          # what the client will READ
    sock.sendall(b'ready\n')
    f = sock.makefile()
    # 1. SEND
    wc = poll(side.cq, 'server recv')
    if wc.opcode != e.IBV_WC_RECV or wc.byte_len != 4096:
        fail(f'recv: opcode {wc.opcode} byte_len {wc.byte_len}')
    if side.mr.read(4096, 0) != pattern(3)[:4096]:
        fail('SEND payload differs')
    print('ok   server: SEND of 4096 bytes received intact', flush=True)
    side.mr.write(pattern(7), SIZE)
    sock.sendall(b'recv-checked\n')
    # 2. WRITE: the client says when it has completed
    if f.readline().strip() != 'written':
        fail('no "written" from the client')
    if side.mr.read(SIZE, 0) != pattern(5):
        fail('WRITE did not land intact')
    print(f'ok   server: WRITE of {SIZE} bytes landed intact, '
          'no verbs call on this side', flush=True)
    side.mr.write(pattern(7), SIZE)
    sock.sendall(b'restored\n')
    if f.readline().strip() != 'done':
        fail('client did not finish')


def client(host, port):
    side = Side()
    sock = socket.create_connection((host, port))
    peer = exchange(sock, side.info())
    side.connect(peer)
    f = sock.makefile()
    if f.readline().strip() != 'ready':
        fail('server not ready')
    # 1. SEND
    side.mr.write(pattern(3), SIZE)
    side.qp.post_send(SendWR(wr_id=2, opcode=e.IBV_WR_SEND, num_sge=1,
                             sg=[SGE(side.mr.buf, 4096, side.mr.lkey)]))
    wc = poll(side.cq, 'client send')
    if wc.opcode != e.IBV_WC_SEND:
        fail(f'send: opcode {wc.opcode}')
    if f.readline().strip() != 'recv-checked':
        fail('server did not check the SEND')
    print('ok   client: SEND completed', flush=True)
    # 2. WRITE
    side.mr.write(pattern(5), SIZE)
    wr = SendWR(wr_id=3, opcode=e.IBV_WR_RDMA_WRITE, num_sge=1,
                sg=[SGE(side.mr.buf, SIZE, side.mr.lkey)])
    wr.set_wr_rdma(peer['rkey'], peer['addr'])
    side.qp.post_send(wr)
    poll(side.cq, 'client write')
    sock.sendall(b'written\n')
    if f.readline().strip() != 'restored':
        fail('server did not check the WRITE')
    print(f'ok   client: WRITE of {SIZE} bytes completed', flush=True)
    # 3. READ
    side.mr.write(bytes(SIZE), SIZE)
    wr = SendWR(wr_id=4, opcode=e.IBV_WR_RDMA_READ, num_sge=1,
                sg=[SGE(side.mr.buf, SIZE, side.mr.lkey)])
    wr.set_wr_rdma(peer['rkey'], peer['addr'])
    side.qp.post_send(wr)
    wc = poll(side.cq, 'client read')
    if wc.opcode != e.IBV_WC_RDMA_READ:
        fail(f'read: opcode {wc.opcode}')
    if side.mr.read(SIZE, 0) != pattern(7):
        fail('READ brought back other bytes')
    print(f'ok   client: READ of {SIZE} bytes brought back the server\'s',
          flush=True)
    sock.sendall(b'done\n')


if __name__ == '__main__':
    if len(sys.argv) == 3 and sys.argv[1] == 'server':
        server(int(sys.argv[2]))
    elif len(sys.argv) == 4 and sys.argv[1] == 'client':
        client(sys.argv[2], int(sys.argv[3]))
    else:
        print(__doc__, file=sys.stderr)
        sys.exit(2)
