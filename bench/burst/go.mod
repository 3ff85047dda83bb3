module dra-guard/bench/burst

go 1.22
