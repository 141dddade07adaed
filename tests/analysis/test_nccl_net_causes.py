"""An NCCL error that only names its ncclResult (internal error, system error) and the network
cause NCCL's WARN printed above it, written from NCCL's and PyTorch's format strings: the WARN is
the failure, of the network."""

from tests.offline.scoring import first_failure_of

# NCCL src/graph/topo.h ncclTopoIdToNetDev WARN("Could not find NET with id %lx") returns
# ncclInternalError; torch NCCLUtils.cpp then raises DistBackendError "NCCL error in: <site>, internal
# error - please report this issue to the NCCL developers, NCCL version <v>"
NET_NOT_FOUND = """\
nid001:5821:5903 [0] NCCL INFO NET/IB : Using [0]mlx5_0:1/IB ; OOB ib0:10.0.0.5<0>
nid001:5821:5903 [0] graph/topo.h:230 NCCL WARN Could not find NET with id 0
[rank0]: Traceback (most recent call last):
[rank0]:   File "/work/train.py", line 12, in <module>
[rank0]:     dist.all_reduce(t)
[rank0]:   File "/usr/lib/python3/dist-packages/torch/distributed/distributed_c10d.py", line 2501, in all_reduce
[rank0]:     work = group.allreduce([tensor], opts)
[rank0]: torch.distributed.DistBackendError: NCCL error in: /opt/pytorch/torch/csrc/distributed/c10d/ProcessGroupNCCL.cpp:3376, internal error - please report this issue to the NCCL developers, NCCL version 2.25.1
"""

WRAPPER_ONLY = NET_NOT_FOUND.replace(
    "nid001:5821:5903 [0] graph/topo.h:230 NCCL WARN Could not find NET with id 0\n", "")

# NCCL src/misc/socket.cc socketProgressOpt (2.10-2.17): WARN("Net : Call to recv from %s failed : %s")
REFUSED = """\
node2: node2:15874:17290 [4] include/socket.h:423 NCCL WARN Net : Call to recv from 10.1.2.7<56843> failed : Connection refused
node2: RuntimeError: NCCL error in: ProcessGroupNCCL.cpp:1269, unhandled system error, NCCL version 2.14.3
"""


def test_a_net_device_the_topology_lacks_is_the_network_at_init():
    got = first_failure_of(NET_NOT_FOUND)
    assert (got["signature"], got["category"], got["phase"]) == ("nccl.net_not_found", "network", "init")


def test_the_internal_error_alone_stays_nccl_s_own():
    assert first_failure_of(WRAPPER_ONLY)["signature"] == "nccl.internal_error"


def test_a_refused_socket_is_the_network():
    got = first_failure_of(REFUSED)
    assert (got["signature"], got["category"]) == ("nccl.socket_io_unreachable", "network")



# torch NCCLUtils.hpp (1.7-1.13): "NCCL error in: <site>, unhandled system error, NCCL version <v>" then
# getNcclErrorDetailStr's "ncclSystemError: System call (socket, malloc, munmap, etc) failed." on the
# next line of the same message, raised from DistributedDataParallel's constructor: set-up
DDP_INIT_SYSTEM_ERROR = """\
# RuntimeError: NCCL error in: /pytorch/torch/lib/c10d/ProcessGroupNCCL.cpp:911, unhandled system error, NCCL version 2.7.8
Traceback (most recent call last):
  File "/work/train.py", line 48, in <module>
    model = DistributedDataParallel(model, device_ids=[rank])
  File "/usr/lib/python3/dist-packages/torch/nn/parallel/distributed.py", line 496, in __init__
    dist._verify_model_across_ranks(self.process_group, parameters)
RuntimeError: NCCL error in: /pytorch/torch/lib/c10d/ProcessGroupNCCL.cpp:911, unhandled system error, NCCL version 2.7.8
ncclSystemError: System call (socket, malloc, munmap, etc) failed.
"""


def test_a_line_of_an_exception_message_keeps_its_traceback_s_phase():
    got = first_failure_of(DDP_INIT_SYSTEM_ERROR)
    assert (got["signature"], got["phase"]) == ("nccl.system_error", "init")


def test_an_address_no_interface_filled_in_is_the_interface_setting():
    """NCCL's "Last error:" under an internal error names a socket address never filled in (no interface
    matched NCCL_SOCKET_IFNAME): its family is garbage (socket.cc ncclSocketInit, 2.19+)."""
    text = WRAPPER_ONLY + "[rank0]: ncclInternalError: Internal check failed.\n[rank0]: Last error:\n" \
        "[rank0]: ncclSocketInit: connecting to address  with family 59936 is neither AF_INET(2) nor AF_INET6(10)\n"
    ff = first_failure_of(text)
    assert (ff["signature"], ff["category"], ff["phase"]) == ("nccl.no_interface", "config", "init")
