#!/bin/bash
set -e
cat > /app/hello.sh <<'SH'
#!/bin/sh
name=$(sed -n 's/^name=//p' /app/conf/settings.ini)
echo "Hello, $name!"
SH
chmod +x /app/hello.sh
