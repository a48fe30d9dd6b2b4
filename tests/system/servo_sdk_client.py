"""Feetech's own SDK (feetech-servo-sdk) as a client of reflex's emulated servos: opens the
pseudo-terminal with its PortHandler (pyserial underneath), pings, reads, writes and sync-reads.

usage: servo_sdk_client.py PORT
prints JSON: {"model": ..., "ping_error": ..., "goal_written": ..., "positions": {id: steps}, "missing": ...}
"""
import json
import sys
import time

import scservo_sdk as scs

port = scs.PortHandler(sys.argv[1])
assert port.openPort(), "openPort"
assert port.setBaudRate(1000000), "setBaudRate"
ph = scs.PacketHandler(0)
out = {}
model, result, error = ph.ping(port, 1)
out["model"] = model if result == scs.COMM_SUCCESS else ph.getTxRxResult(result)
result, error = ph.write1ByteTxRx(port, 2, 40, 1)  # Torque_Enable
out["torque"] = result == scs.COMM_SUCCESS
result, error = ph.write2ByteTxRx(port, 2, 42, 3000)  # Goal_Position
out["goal_written"] = result == scs.COMM_SUCCESS
time.sleep(0.5)
sync = scs.GroupSyncRead(port, ph, 56, 2)  # Present_Position
for i in range(1, 7):
    sync.addParam(i)
result = sync.txRxPacket()
out["sync_result"] = ph.getTxRxResult(result)
out["positions"] = {i: sync.getData(i, 56, 2) for i in range(1, 7) if sync.isAvailable(i, 56, 2)}
_, result, _ = ph.ping(port, 9)
out["missing"] = ph.getTxRxResult(result)
port.closePort()
print(json.dumps(out))
