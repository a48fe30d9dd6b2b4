"""The vendors' own SDKs (feetech-servo-sdk, dynamixel-sdk) as clients of reflex's emulated
servos: open the pseudo-terminal with their PortHandler (pyserial underneath), ping, write and
sync-read.

usage: servo_sdk_client.py PORT [feetech|dynamixel]
prints JSON: {"model": ..., "ping_error": ..., "goal_written": ..., "positions": {id: steps}, "missing": ...}
"""
import json
import sys
import time

import scservo_sdk as scs

if len(sys.argv) > 2 and sys.argv[2] == "dynamixel":
    import dynamixel_sdk as sdk

    ph = sdk.PacketHandler(2.0)
    torque, goal, present, size = 64, 116, 132, 4
else:
    sdk = scs
    ph = scs.PacketHandler(0)
    torque, goal, present, size = 40, 42, 56, 2
port = sdk.PortHandler(sys.argv[1])
assert port.openPort(), "openPort"
assert port.setBaudRate(1000000), "setBaudRate"
out = {}
model, result, error = ph.ping(port, 1)
out["model"] = model if result == sdk.COMM_SUCCESS else ph.getTxRxResult(result)
result, error = ph.write1ByteTxRx(port, 2, torque, 1)
out["torque"] = result == sdk.COMM_SUCCESS
write = ph.write2ByteTxRx if size == 2 else ph.write4ByteTxRx
result, error = write(port, 2, goal, 3000)
out["goal_written"] = result == sdk.COMM_SUCCESS
time.sleep(0.5)
sync = sdk.GroupSyncRead(port, ph, present, size)
for i in range(1, 7):
    sync.addParam(i)
result = sync.txRxPacket()
out["sync_result"] = ph.getTxRxResult(result)
out["positions"] = {i: sync.getData(i, present, size) for i in range(1, 7) if sync.isAvailable(i, present, size)}
_, result, _ = ph.ping(port, 9)
out["missing"] = ph.getTxRxResult(result)
port.closePort()
print(json.dumps(out))
