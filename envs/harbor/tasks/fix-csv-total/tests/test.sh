#!/bin/bash
# Writes reward.json (Harbor reads it before reward.txt): the reward and what was checked.
mkdir -p /logs/verifier
out=$(cd /tmp && python3 /app/report.py 2>&1)
echo "report.py printed: $out"
if [ "$out" = "total: 50 $REPORT_CURRENCY" ]; then
  echo '{"reward": 1.0, "checks": 1}' > /logs/verifier/reward.json
else
  echo '{"reward": 0.0, "checks": 1}' > /logs/verifier/reward.json
fi
