module github.com/berthsh/berth

go 1.26.8
