#!/bin/bash
set -e
wc -w < /app/words.txt | tr -d ' ' > /app/count.txt
