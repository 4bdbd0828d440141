#!/bin/bash
set -e
sed -i 's/row\["quantity"\]/row["amount"]/' /app/report.py
