# `slipstream-train --self-check` passes and finds the variant the image was built for ($1).
out=$(slipstream-train --self-check 2>&1) || { echo "$out"; exit 1; }
echo "$out"
if ! grep -Eq "^ +variant +$1\$" <<<"$out"; then echo "the self-check did not find the $1 variant"; exit 1; fi
echo "ok: self-check passed (variant $1)"
