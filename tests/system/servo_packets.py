"""The servo vendors' own SDKs as test peers: prints the instruction packets that Feetech's
`scservo_sdk` (feetech-servo-sdk) and ROBOTIS's `dynamixel_sdk` build for a fixed list of
instructions, and parses status packets given on stdin (JSON) with the SDKs' own receive code.

usage: servo_packets.py < {"feetech_status": [[bytes...], ...], "dynamixel_status": [[...], ...]}
prints JSON: {"feetech": {name: [bytes]}, "dynamixel": {name: [bytes]},
              "feetech_parsed": [[id, error, params] | error string], "dynamixel_parsed": [...]}
"""
import json
import sys

import dynamixel_sdk as dxl
import scservo_sdk as scs


class Port:
    """A port handler that keeps what the SDK writes and serves given bytes to its reader."""

    def __init__(self, rx=b""):
        self.is_using = False
        self.sent = []
        self.rx = list(rx)
        self.baudrate = 1000000

    def clearPort(self):
        pass

    def writePort(self, packet):
        self.sent.append(list(packet))
        return len(packet)

    def readPort(self, length):
        out, self.rx = self.rx[:length], self.rx[length:]
        return out

    def getBytesAvailable(self):
        return len(self.rx)

    def setPacketTimeout(self, n):
        pass

    def setPacketTimeoutMillis(self, ms):
        pass

    def isPacketTimeout(self):
        return True

    def getBaudRate(self):
        return self.baudrate


def capture(fn):
    port = Port()
    fn(port)
    return port.sent[0]


cases = json.load(sys.stdin)
out = {"feetech": {}, "dynamixel": {}, "feetech_parsed": [], "dynamixel_parsed": []}

st = scs.PacketHandler(0)  # protocol end 0: STS/SMS, little-endian
ft = out["feetech"]
ft["ping_1"] = capture(lambda p: st.ping(p, 1))
ft["read_3_pos"] = capture(lambda p: st.readTx(p, 3, 56, 2))
ft["write_2_goal"] = capture(lambda p: st.writeTxOnly(p, 2, 42, 2, [0x00, 0x08]))
ft["regwrite_4_torque"] = capture(lambda p: st.regWriteTxOnly(p, 4, 40, 1, [1]))
ft["action_all"] = capture(lambda p: st.action(p, scs.BROADCAST_ID))
ft["sync_read_pos"] = capture(lambda p: st.syncReadTx(p, 56, 2, [1, 2, 3, 4, 5, 6], 6))
ft["sync_write_goal"] = capture(
    lambda p: st.syncWriteTxOnly(p, 42, 2, [1, 0xFF, 0x07, 2, 0x00, 0x08, 6, 0x34, 0x12], 9)
)

d2 = dxl.PacketHandler(2.0)
dx = out["dynamixel"]
dx["ping_1"] = capture(lambda p: d2.ping(p, 1))
dx["read_3_pos"] = capture(lambda p: d2.readTx(p, 3, 132, 4))
dx["write_2_goal"] = capture(lambda p: d2.writeTxOnly(p, 2, 116, 4, [0x00, 0x08, 0x00, 0x00]))
dx["write_stuffed"] = capture(lambda p: d2.writeTxOnly(p, 1, 116, 4, [0xFF, 0xFF, 0xFD, 0x00]))
dx["sync_read_pos"] = capture(lambda p: d2.syncReadTx(p, 132, 4, [1, 2, 3, 4, 5, 6], 6, False))
dx["sync_write_goal"] = capture(
    lambda p: d2.syncWriteTxOnly(p, 116, 4, [1, 0, 8, 0, 0, 2, 0xFF, 0xFF, 0xFD, 0xFF], 10)
)
dx["bulk_read"] = capture(lambda p: d2.bulkReadTx(p, [1, 132, 0, 4, 0, 2, 126, 0, 2, 0], 10, False))

for pkt in cases.get("feetech_status", []):
    port = Port(bytes(pkt))
    rx, result = st.rxPacket(port)
    out["feetech_parsed"].append(
        [rx[2], rx[4], rx[5:-1]] if result == scs.COMM_SUCCESS else st.getTxRxResult(result)
    )
for pkt in cases.get("dynamixel_status", []):
    port = Port(bytes(pkt))
    rx, result = d2.rxPacket(port, False)
    if result == dxl.COMM_SUCCESS:
        length = rx[5] | rx[6] << 8
        out["dynamixel_parsed"].append([rx[4], rx[8], rx[9 : 7 + length - 2]])
    else:
        out["dynamixel_parsed"].append(d2.getTxRxResult(result))
print(json.dumps(out))
