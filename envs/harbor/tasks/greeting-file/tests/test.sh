#!/bin/bash
mkdir -p /logs/verifier
# The name is changed first: a script that prints a fixed text fails.
sed -i 's/^name=.*/name=harbor/' /app/conf/settings.ini
if [ -x /app/hello.sh ] && [ "$(/app/hello.sh)" = "Hello, harbor!" ]; then
  echo 1 > /logs/verifier/reward.txt
else
  echo 0 > /logs/verifier/reward.txt
fi
